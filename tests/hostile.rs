//! Hostile input: random calls with adversarial arguments through every
//! public entry point of `AddressSpace`, as an emulator or sandbox that
//! passes guest syscalls straight through would make them.
//!
//! Arguments come from the values that break careless arithmetic (0, 1,
//! 4095, 4096, 2^47 ± 4096, the task size ± 1, 2^63, `u64::MAX`,
//! `u64::MAX - 4095`), random 64-bit values, page-aligned addresses near
//! the VMAs that exist when the call is made, lengths that make
//! `addr + len` wrap or end just past the task size, and flag words with
//! unknown bits (`from_bits_retain`). After every call:
//!
//! - it did not panic (proptest turns a panic into a failure; run this file
//!   in a debug build too, `cargo test --test hostile`, where overflowing
//!   arithmetic panics);
//! - an error is an errno Linux can return for that call, and a call that
//!   Linux rejects before doing anything left the layout as it was;
//! - a success did what it says (the mapping is there, the range is gone,
//!   the protection is set);
//! - the VMAs are sorted, disjoint, page-aligned, non-empty, at or above
//!   `mmap_min_addr` and below the task size.
//!
//! At the end, a fresh mapping still works (a pattern written reads back),
//! and a fork of the final state keeps the same invariants.
//!
//! The plain `#[test]`s below are regression cases for the defects this
//! test found, each compared with the running kernel where it can make the
//! call: in a forked child, so a call that would unmap more than it should
//! can only harm the child.
//!
//! Overflow checks: CI runs `cargo test --release`, so
//! `[profile.release.package.aspace]` turns `overflow-checks` on (this
//! crate's release builds only; benches keep them off). Measured with
//! `examples/pft --threads 1 --no-zero --no-writer --reps 10 --mib 512`,
//! six runs alternating with a build where every crate had the checks:
//! mean faults/cpu over both workloads and both locking modes 19.45 M
//! with the checks, 19.27 M without, run-to-run noise about 5% on the
//! shared 2-core machine: no measurable cost.
//!
//! A longer hunt, in a debug build (where overflow always panics):
//! `HOSTILE_CASES=3000 HOSTILE_SEED=7 cargo test --test hostile`.

mod common;

use aspace::mm::config::DEFAULT_TASK_SIZE;
use aspace::uffd::{FillError, PageCategories, RegisterMode, ScanArgs, ScanFlags, UffdBuilder};
use aspace::{
    Access, AddressSpace, Advice, ClearRefs, Config, Error, FaultLocking, MapFlags, Memfd,
    MremapFlags, Prot, VmaInfo, WriterLocking, PAGE_SIZE,
};
use common::kernel::parse_maps_line;
use common::{
    normalize, AspaceTarget, KernelTarget, Region, Res, Target, Vma, ANON, EEXIST, EFAULT, EINVAL,
    ENOMEM, EPERM, MAP_FIXED, MREMAP_FIXED, MREMAP_MAYMOVE, RW,
};
use proptest::prelude::*;
use std::io::Read as _;
use std::os::fd::FromRawFd as _;

const TASK: u64 = DEFAULT_TASK_SIZE;
const ENOENT: i32 = 2;
const EAGAIN: i32 = 11;
const EBUSY: i32 = 16;
const EFBIG: i32 = 27;
/// Memory budget of every address space here (frames, page tables and
/// metadata): calls past it fail with ENOMEM instead of growing the test
/// process, however long the mapping.
const BUDGET: u64 = 16 << 20;
/// Longest buffer `read`/`write` use (the buffer is real memory).
const MAX_COPY: usize = 3 * PAGE_SIZE as usize + 17;

// ---------------------------------------------------------------- values

/// An address-like argument, resolved when the call is made.
#[derive(Clone, Debug)]
enum Num {
    /// This value.
    Lit(u64),
    /// The start (or end) of the `vma`-th VMA (modulo their count), moved
    /// by `pages` pages (wrapping).
    Near { vma: usize, end: bool, pages: i32 },
}

/// A length argument, resolved against the address it goes with.
#[derive(Clone, Debug)]
enum Len {
    /// This value.
    Lit(u64),
    /// This many pages (plus `extra` bytes).
    Pages(u64, u64),
    /// A length with which `addr + len` wraps past `u64::MAX` by `by`.
    Wrap(u64),
    /// `task_size - addr + delta` (wrapping): ends at the task size.
    ToTask(i64),
    /// The length of the `vma`-th VMA, moved by `pages` pages.
    OfVma { vma: usize, pages: i32 },
}

/// Values that break careless arithmetic.
fn special() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0),
        Just(1),
        Just(4095),
        Just(4096),
        Just(8192),
        Just((1 << 47) - 4096),
        Just(1 << 47),
        Just((1 << 47) + 4096),
        Just(TASK - 1),
        Just(TASK + 1),
        Just(1 << 63),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(u64::MAX - 4095),
        Just(u64::MAX - 4096),
        Just(u64::MAX - 8191),
        Just(65536),
        Just(65535),
    ]
}

fn num() -> impl Strategy<Value = Num> {
    prop_oneof![
        3 => special().prop_map(Num::Lit),
        2 => any::<u64>().prop_map(Num::Lit),
        // Random page-aligned addresses in user space.
        2 => (0u64..(TASK >> 12)).prop_map(|p| Num::Lit(p << 12)),
        4 => (any::<usize>(), any::<bool>(), -40i32..40)
            .prop_map(|(vma, end, pages)| Num::Near { vma, end, pages }),
    ]
}

fn len() -> impl Strategy<Value = Len> {
    prop_oneof![
        3 => special().prop_map(Len::Lit),
        1 => any::<u64>().prop_map(Len::Lit),
        4 => (0u64..64, prop_oneof![4 => Just(0u64), 1 => 1u64..4096]).prop_map(|(p, e)| Len::Pages(p, e)),
        2 => prop_oneof![Just(0u64), Just(1), Just(4095), Just(4096), 0u64..(1 << 20)].prop_map(Len::Wrap),
        2 => prop_oneof![Just(0i64), Just(1), Just(-1), Just(4096), Just(-4096), Just(-8192)].prop_map(Len::ToTask),
        3 => (any::<usize>(), -8i32..8).prop_map(|(vma, pages)| Len::OfVma { vma, pages }),
    ]
}

/// A flag word: some of the known bits, sometimes with unknown ones.
fn bits(known: u32) -> impl Strategy<Value = u32> {
    let extra = prop_oneof![
        6 => Just(0u32),
        1 => (0u32..32).prop_map(|b| 1 << b),
        1 => any::<u32>(),
    ];
    (prop::bits::u32::masked(known), extra).prop_map(|(k, e)| k | e)
}

fn map_flags() -> impl Strategy<Value = u32> {
    let all = MapFlags::all().bits();
    prop_oneof![
        // Mostly well-formed: one type, PRIVATE, SHARED or DROPPABLE.
        3 => (bits(all & !MapFlags::TYPE), 0..5usize)
            .prop_map(|(b, t)| b | [0x1, 0x2, 0x2, 0x2, 0x8][t]),
        1 => bits(all),
    ]
}

fn prot() -> impl Strategy<Value = u32> {
    prop_oneof![
        3 => prop::bits::u32::masked(Prot::ACCESS.bits()),
        1 => bits(Prot::all().bits()),
    ]
}

// ---------------------------------------------------------------- ops

#[derive(Clone, Debug)]
enum Op {
    Mmap {
        addr: Num,
        len: Len,
        prot: u32,
        flags: u32,
    },
    Munmap {
        addr: Num,
        len: Len,
    },
    Mprotect {
        addr: Num,
        len: Len,
        prot: u32,
    },
    Mremap {
        old: Num,
        old_len: Len,
        new_len: Len,
        flags: u32,
        new_addr: Num,
    },
    Madvise {
        addr: Num,
        len: Len,
        dontneed: bool,
    },
    Brk {
        addr: Num,
    },
    Read {
        addr: Num,
        len: usize,
    },
    Write {
        addr: Num,
        len: usize,
        seed: u8,
    },
    Fault {
        addr: Num,
        access: u8,
    },
    Fork,
    /// The read-only entry points: vmas, maps, stats, counters, translate,
    /// rmap_walk; and `prefault_frames(bytes)` if `prefault` (half the
    /// time: touching the whole budget is the slowest call here).
    Inspect {
        addr: Num,
        bytes: Num,
        prefault: bool,
    },
    /// A userfault handle: register `[addr, addr + len)` with `mode` bits,
    /// one fill or protection call (`what`) at `[at, at + n)`, unregister,
    /// drop.
    Uffd {
        addr: Num,
        len: Len,
        mode: u64,
        wp_async: bool,
        what: u8,
        at: Num,
        n: Len,
    },
    /// `pagemap_scan` with arbitrary bounds, flags, masks and limits.
    Scan {
        start: Num,
        end: Num,
        flags: u64,
        masks: [u64; 4],
        max_pages: u64,
        max_regions: usize,
    },
    /// `pagemap` and `clear_refs` with arbitrary arguments.
    Pagemap {
        addr: Num,
        len: Len,
        clear: i64,
    },
    /// A memfd of `size` bytes mapped with arbitrary arguments, written
    /// through the mapping, then resized to `resize`.
    MapFd {
        addr: Num,
        len: Len,
        prot: u32,
        flags: u32,
        offset: Num,
        size: Len,
        resize: Len,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => (num(), len(), prot(), map_flags())
            .prop_map(|(addr, len, prot, flags)| Op::Mmap { addr, len, prot, flags }),
        2 => (num(), len()).prop_map(|(addr, len)| Op::Munmap { addr, len }),
        3 => (num(), len(), prot()).prop_map(|(addr, len, prot)| Op::Mprotect { addr, len, prot }),
        4 => (num(), len(), len(), bits(MremapFlags::all().bits()), num()).prop_map(
            |(old, old_len, new_len, flags, new_addr)| Op::Mremap { old, old_len, new_len, flags, new_addr }
        ),
        2 => (num(), len(), any::<bool>())
            .prop_map(|(addr, len, dontneed)| Op::Madvise { addr, len, dontneed }),
        2 => num().prop_map(|addr| Op::Brk { addr }),
        2 => (num(), 0..MAX_COPY).prop_map(|(addr, len)| Op::Read { addr, len }),
        3 => (num(), 0..MAX_COPY, any::<u8>())
            .prop_map(|(addr, len, seed)| Op::Write { addr, len, seed }),
        2 => (num(), 0u8..3).prop_map(|(addr, access)| Op::Fault { addr, access }),
        1 => Just(Op::Fork),
        1 => (num(), num(), any::<bool>())
            .prop_map(|(addr, bytes, prefault)| Op::Inspect { addr, bytes, prefault }),
        2 => (num(), len(), prop_oneof![3 => 1u64..8, 1 => any::<u64>()], any::<bool>(), 0u8..7, num(), len())
            .prop_map(|(addr, len, mode, wp_async, what, at, n)| Op::Uffd { addr, len, mode, wp_async, what, at, n }),
        1 => (num(), num(), prop_oneof![3 => 0u64..4, 1 => any::<u64>()],
              [prop_oneof![3 => 0u64..512, 1 => any::<u64>()], prop_oneof![3 => 0u64..512, 1 => any::<u64>()],
               prop_oneof![3 => 0u64..512, 1 => any::<u64>()], prop_oneof![3 => 0u64..512, 1 => any::<u64>()]],
              prop_oneof![Just(0u64), 1u64..64, any::<u64>()], prop_oneof![Just(0usize), 1usize..64, Just(usize::MAX)])
            .prop_map(|(start, end, flags, masks, max_pages, max_regions)| Op::Scan { start, end, flags, masks, max_pages, max_regions }),
        1 => (num(), len(), prop_oneof![3 => 0i64..7, 1 => any::<i64>()])
            .prop_map(|(addr, len, clear)| Op::Pagemap { addr, len, clear }),
        2 => (num(), len(), prot(), map_flags(), num(), len(), len())
            .prop_map(|(addr, len, prot, flags, offset, size, resize)| Op::MapFd { addr, len, prot, flags, offset, size, resize }),
    ]
}

/// Configurations: the default layout with a small budget, optionally a
/// small `max_map_count` (so the map-count limits are reached), the
/// mmap_lock fault mode, no `mmap_min_addr` (page 0 mappable) and extreme
/// stack guard gaps (the embedder's choice, which arithmetic must survive
/// too).
fn config() -> impl Strategy<Value = Config> {
    (
        any::<bool>(),
        any::<bool>(),
        prop_oneof![3 => Just(65536u64), 1 => Just(0)],
        prop_oneof![3 => Just(256 * PAGE_SIZE), 1 => Just(0), 1 => Just(u64::MAX)],
    )
        .prop_map(
            |(few_maps, mmap_lock, mmap_min_addr, stack_guard_gap)| Config {
                memory_budget: BUDGET,
                max_map_count: if few_maps { 24 } else { 65530 },
                fault_locking: if mmap_lock {
                    FaultLocking::MmapLock
                } else {
                    FaultLocking::PerVma
                },
                mmap_min_addr,
                stack_guard_gap,
                ..Config::default()
            },
        )
}

// ---------------------------------------------------------------- state

struct Hostile {
    mm: AddressSpace,
}

fn page_align(len: u64) -> Option<u64> {
    len.checked_add(PAGE_SIZE - 1).map(|l| l & !(PAGE_SIZE - 1))
}

/// Fails unless `e` is none or one of `ok`.
fn allowed(e: Option<i32>, ok: &[i32]) -> Result<(), TestCaseError> {
    match e {
        Some(e) if !ok.contains(&e) => Err(TestCaseError::fail(format!(
            "errno {e}, expected one of {ok:?}"
        ))),
        _ => Ok(()),
    }
}

fn errno<T>(r: &Result<T, Error>) -> Option<i32> {
    r.as_ref().err().map(|e| e.errno())
}

fn pattern(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) | 1)
        .collect()
}

impl Hostile {
    fn new(cfg: Config) -> Hostile {
        let mm = AddressSpace::new(cfg);
        let rw = Prot::READ | Prot::WRITE;
        let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
        // Some ordinary state to aim at: private memory with data, a
        // shared mapping, a stack, a heap.
        let a = mm.mmap(0, 16 * PAGE_SIZE, rw, anon).unwrap();
        mm.write(a + 100, &pattern(7, 3 * PAGE_SIZE as usize))
            .unwrap();
        let s = mm
            .mmap(0, 4 * PAGE_SIZE, rw, MapFlags::SHARED | MapFlags::ANONYMOUS)
            .unwrap();
        mm.write(s, b"shared").unwrap();
        let g = mm
            .mmap(0, 8 * PAGE_SIZE, rw, anon | MapFlags::GROWSDOWN)
            .unwrap();
        mm.write(g + 7 * PAGE_SIZE, b"stack").unwrap();
        // (Refused when the stack's guard gap covers all of user space.)
        let b = mm.brk(0).unwrap();
        let _ = mm.brk(b + 3 * PAGE_SIZE);
        Hostile { mm }
    }

    fn num(&self, vmas: &[VmaInfo], n: &Num) -> u64 {
        match *n {
            Num::Lit(v) => v,
            Num::Near { vma, end, pages } => {
                if vmas.is_empty() {
                    return (pages as i64 as u64).wrapping_mul(PAGE_SIZE);
                }
                let v = &vmas[vma % vmas.len()];
                let base = if end { v.end } else { v.start };
                base.wrapping_add((pages as i64 as u64).wrapping_mul(PAGE_SIZE))
            }
        }
    }

    fn len(&self, vmas: &[VmaInfo], l: &Len, addr: u64) -> u64 {
        match *l {
            Len::Lit(v) => v,
            Len::Pages(p, extra) => p * PAGE_SIZE + extra,
            // addr + (2^64 - addr + by) = 2^64 + by.
            Len::Wrap(by) => 0u64.wrapping_sub(addr).wrapping_add(by).max(1),
            Len::ToTask(d) => TASK.wrapping_sub(addr).wrapping_add(d as u64),
            Len::OfVma { vma, pages } => {
                if vmas.is_empty() {
                    return PAGE_SIZE;
                }
                let v = &vmas[vma % vmas.len()];
                (v.end - v.start).wrapping_add((pages as i64 as u64).wrapping_mul(PAGE_SIZE))
            }
        }
    }

    /// Runs `op`, checking what it returned and what it did.
    fn apply(&mut self, op: &Op) -> Result<(), TestCaseError> {
        let mm = &self.mm;
        let before = mm.vmas();
        let cfg = mm.config().clone();
        let (task, min) = (cfg.task_size, cfg.mmap_min_addr);
        match op {
            Op::Mmap {
                addr,
                len,
                prot,
                flags,
            } => {
                let addr = self.num(&before, addr);
                let len = self.len(&before, len, addr);
                // Any length with any flags, SHARED and POPULATE included:
                // the memory budget bounds what they cost the host.
                let flags = MapFlags::from_bits_retain(*flags);
                let prot = Prot::from_bits_retain(*prot);
                let r = mm.mmap(addr, len, prot, flags);
                let fixed = flags.intersects(MapFlags::FIXED | MapFlags::FIXED_NOREPLACE);
                match r {
                    Ok(a) => {
                        let alen = page_align(len).expect("mapped length");
                        prop_assert!(a % PAGE_SIZE == 0 && a >= min);
                        prop_assert!(a.checked_add(alen).is_some_and(|e| e <= task));
                        if fixed {
                            prop_assert_eq!(a, addr);
                        }
                        let want = Prot::from_bits_truncate(prot.bits() & Prot::ACCESS.bits());
                        self.assert_covered(a, alen, Some(want))?;
                    }
                    Err(e) => {
                        // A fixed address in the last 4095 bytes reads as
                        // an error value in the kernel: any errno.
                        // EAGAIN: MAP_LOCKED past the memlock limit.
                        let any = fixed && addr > u64::MAX - 4095;
                        prop_assert!(
                            any || [
                                EINVAL,
                                libc::ENOMEM,
                                libc::EPERM,
                                libc::EEXIST,
                                libc::EAGAIN
                            ]
                            .contains(&e.errno()),
                            "mmap: {e}"
                        );
                        // Only the map-count check after a FIXED unmap
                        // comes after a change.
                        if e != Error::NoMem || !fixed {
                            prop_assert_eq!(&mm.vmas(), &before, "mmap failed with {}", e);
                        }
                    }
                }
            }
            Op::Munmap { addr, len } => {
                let addr = self.num(&before, addr);
                let len = self.len(&before, len, addr);
                let r = mm.munmap(addr, len);
                match r {
                    Ok(()) => {
                        let end = addr + page_align(len).expect("unmapped length");
                        let left = mm.vmas();
                        prop_assert!(
                            left.iter().all(|v| v.end <= addr || v.start >= end),
                            "munmap({:#x}, {:#x}) left a VMA inside",
                            addr,
                            len
                        );
                    }
                    Err(e) => {
                        prop_assert!([EINVAL, libc::ENOMEM].contains(&e.errno()), "munmap: {e}");
                        // ENOMEM from the end's split (no room for the
                        // VMA) may leave the start's split done, as in
                        // Linux: the same pages, mapped the same way.
                        prop_assert_eq!(
                            unsplit(&mm.vmas()),
                            unsplit(&before),
                            "munmap failed with {}",
                            e
                        );
                    }
                }
            }
            Op::Mprotect { addr, len, prot } => {
                let addr = self.num(&before, addr);
                let len = self.len(&before, len, addr);
                let prot = Prot::from_bits_retain(*prot);
                let r = mm.mprotect(addr, len, prot);
                match r {
                    Ok(()) if len != 0 && !prot.contains(Prot::GROWSDOWN) => {
                        let alen = page_align(len).expect("protected length");
                        self.assert_covered(addr, alen, Some(prot & Prot::ACCESS))?;
                    }
                    Ok(()) => {}
                    Err(e) => {
                        prop_assert!(
                            [EINVAL, libc::ENOMEM, libc::EACCES].contains(&e.errno()),
                            "mprotect: {e}"
                        );
                        // ENOMEM and EACCES may come after the VMAs before
                        // a hole (or before the forbidden one) changed.
                        if e == Error::Inval {
                            prop_assert_eq!(&mm.vmas(), &before, "mprotect failed with {}", e);
                        }
                    }
                }
            }
            Op::Mremap {
                old,
                old_len,
                new_len,
                flags,
                new_addr,
            } => {
                let old = self.num(&before, old);
                let old_len = self.len(&before, old_len, old);
                let new_len = self.len(&before, new_len, old);
                let new_addr = self.num(&before, new_addr);
                let flags = MremapFlags::from_bits_retain(*flags);
                let r = mm.mremap(old, old_len, new_len, flags, new_addr);
                match r {
                    Ok(a) => {
                        let nlen = page_align(new_len).expect("remapped length");
                        prop_assert!(a % PAGE_SIZE == 0 && a >= min);
                        if flags.contains(MremapFlags::FIXED) {
                            prop_assert_eq!(a, new_addr);
                        }
                        // Where something new was mapped (a grow, a move)
                        // the whole new range is, inside the task size. A
                        // shrink or a same-size call returns the old
                        // address and keeps what was there, holes
                        // included (the old range is not checked); a FIXED
                        // move of several VMAs keeps the holes.
                        let olen = old_len.wrapping_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
                        let implies_new =
                            flags.intersects(MremapFlags::FIXED | MremapFlags::DONTUNMAP);
                        if implies_new || nlen > olen {
                            prop_assert!(a.checked_add(nlen).is_some_and(|e| e <= task));
                        } else {
                            prop_assert_eq!(a, old);
                        }
                        let multi = flags.contains(MremapFlags::FIXED) && olen == nlen;
                        if (implies_new || nlen > olen) && !multi {
                            self.assert_covered(a, nlen, None)?;
                        }
                    }
                    Err(e) => {
                        // EAGAIN: locked growth past the memlock limit.
                        prop_assert!(
                            [
                                EINVAL,
                                libc::EFAULT,
                                libc::ENOMEM,
                                libc::EPERM,
                                libc::EAGAIN
                            ]
                            .contains(&e.errno()),
                            "mremap: {e}"
                        );
                        // A FIXED call unmaps the target before it can
                        // fail; otherwise errors come first.
                        if !flags.contains(MremapFlags::FIXED) {
                            prop_assert_eq!(&mm.vmas(), &before, "mremap failed with {}", e);
                        }
                    }
                }
            }
            Op::Madvise {
                addr,
                len,
                dontneed,
            } => {
                let addr = self.num(&before, addr);
                let len = self.len(&before, len, addr);
                let advice = if *dontneed {
                    Advice::DontNeed
                } else {
                    Advice::Normal
                };
                let r = mm.madvise(addr, len, advice);
                if let Some(e) = errno(&r) {
                    prop_assert!([EINVAL, libc::ENOMEM].contains(&e), "madvise: errno {e}");
                }
                // madvise never changes VMAs.
                prop_assert_eq!(&mm.vmas(), &before);
            }
            Op::Brk { addr } => {
                let addr = self.num(&before, addr);
                let old = mm.brk(0).expect("brk(0)");
                let got = mm.brk(addr).expect("brk never fails");
                prop_assert!(got == old || got == addr, "brk({addr:#x}) gave {got:#x}");
                if got == old && addr != old {
                    prop_assert_eq!(&mm.vmas(), &before, "a refused brk changed the layout");
                }
                prop_assert_eq!(mm.brk(0), Ok(got));
            }
            Op::Read { addr, len } => {
                let addr = self.num(&before, addr);
                let mut buf = vec![0u8; *len];
                if let Some(e) = errno(&mm.read(addr, &mut buf)) {
                    prop_assert!([libc::EFAULT, libc::ENOMEM].contains(&e), "read: errno {e}");
                }
            }
            Op::Write { addr, len, seed } => {
                let addr = self.num(&before, addr);
                let data = pattern(*seed, *len);
                match mm.write(addr, &data) {
                    Ok(()) => {
                        let mut back = vec![0u8; *len];
                        prop_assert_eq!(mm.read(addr, &mut back), Ok(()));
                        prop_assert!(back == data, "data written at {addr:#x} read back wrong");
                    }
                    Err(e) => prop_assert!(
                        [libc::EFAULT, libc::ENOMEM].contains(&e.errno()),
                        "write: {e}"
                    ),
                }
            }
            Op::Fault { addr, access } => {
                let addr = self.num(&before, addr);
                let access = [Access::Read, Access::Write, Access::Exec][*access as usize];
                let r = mm.fault(addr, access);
                if addr >= task {
                    prop_assert_eq!(r, Err(aspace::FaultError::NoMapping));
                }
            }
            Op::Fork => {
                if let Ok(child) = mm.fork() {
                    let (p, c) = (mm.vmas(), child.vmas());
                    check_layout(&c, &cfg)?;
                    let strip = |v: &[VmaInfo]| -> Vec<(u64, u64, Prot)> {
                        v.iter().map(|v| (v.start, v.end, v.prot)).collect()
                    };
                    prop_assert_eq!(strip(&p), strip(&c));
                    fresh_mapping_works(&child)?;
                }
            }
            Op::Inspect {
                addr,
                bytes,
                prefault,
            } => {
                let addr = self.num(&before, addr);
                let bytes = self.num(&before, bytes);
                let _ = mm.maps();
                let _ = mm.stats();
                let _ = (mm.frames_used(), mm.page_table_bytes(), mm.map_count());
                let _ = (mm.vma_objects(), mm.metadata_bytes_per_vma(), mm.id());
                if addr >= task {
                    prop_assert_eq!(mm.translate(addr), None);
                }
                let _ = mm.rmap_walk(addr);
                if *prefault {
                    mm.prefault_frames(bytes);
                }
            }
            Op::Uffd {
                addr,
                len,
                mode,
                wp_async,
                what,
                at,
                n,
            } => {
                let addr = self.num(&before, addr);
                let len = self.len(&before, len, addr);
                let at = self.num(&before, at);
                let n = self.len(&before, n, at);
                let uffd = UffdBuilder::new().wp_async(*wp_async).create(mm);
                let r = uffd.register_with_mode(addr, len, RegisterMode::from_bits_retain(*mode));
                allowed(errno(&r), &[EINVAL, EPERM, EBUSY, ENOMEM])?;
                let fill = |r: Result<u64, FillError>| {
                    allowed(
                        r.err().map(|e| e.errno()),
                        &[EINVAL, ENOENT, EEXIST, ENOMEM, EFAULT, EAGAIN],
                    )
                };
                match what {
                    0 => {
                        let src = pattern(7, (n as usize).min(2 * PAGE_SIZE as usize));
                        fill(uffd.copy(&src, at, true))?;
                    }
                    1 => fill(uffd.zeropage(at, n, true))?,
                    2 => fill(uffd.continue_(at, n, true))?,
                    3 => allowed(errno(&uffd.write_protect(at, n)), &[EINVAL, ENOENT, ENOMEM])?,
                    4 => allowed(
                        errno(&uffd.remove_write_protection(at, n, true)),
                        &[EINVAL, ENOENT, ENOMEM],
                    )?,
                    5 => allowed(errno(&uffd.wake(at, n)), &[EINVAL])?,
                    _ => {
                        let _ = uffd.try_read_event();
                    }
                }
                allowed(errno(&uffd.unregister(addr, len)), &[EINVAL, ENOMEM])?;
            }
            Op::Scan {
                start,
                end,
                flags,
                masks,
                max_pages,
                max_regions,
            } => {
                let start = self.num(&before, start);
                let end = self.num(&before, end);
                let args = ScanArgs {
                    flags: ScanFlags::from_bits_retain(*flags),
                    category_inverted: PageCategories::from_bits_retain(masks[0]),
                    category_mask: PageCategories::from_bits_retain(masks[1]),
                    category_anyof_mask: PageCategories::from_bits_retain(masks[2]),
                    return_mask: PageCategories::from_bits_retain(masks[3]),
                    max_pages: *max_pages,
                    max_regions: *max_regions,
                };
                match mm.pagemap_scan(start, end, &args) {
                    Ok(found) => {
                        // The end is rounded up to a page, as Linux does.
                        let top = page_align(end.max(start)).unwrap_or(u64::MAX);
                        prop_assert!(found.walk_end <= top, "walk_end {:#x}", found.walk_end);
                        for w in found.regions.windows(2) {
                            prop_assert!(w[0].end <= w[1].start, "regions out of order");
                        }
                    }
                    Err(e) => allowed(Some(e.errno()), &[EINVAL, EFAULT, EPERM, ENOMEM])?,
                }
            }
            Op::Pagemap { addr, len, clear } => {
                let addr = self.num(&before, addr);
                let len = self.len(&before, len, addr);
                match mm.pagemap(addr, len) {
                    // The entries are charged against nothing: they must
                    // fit in the budget, whatever length was asked for.
                    Ok(v) => prop_assert!(v.len() as u64 * 8 <= BUDGET),
                    Err(e) => allowed(Some(e.errno()), &[EINVAL, ENOMEM])?,
                }
                match ClearRefs::from_raw(*clear) {
                    Ok(c) => mm.clear_refs(c),
                    Err(e) => prop_assert_eq!(e.errno(), EINVAL),
                }
            }
            Op::MapFd {
                addr,
                len,
                prot,
                flags,
                offset,
                size,
                resize,
            } => {
                let addr = self.num(&before, addr);
                let len = self.len(&before, len, addr);
                let offset = self.num(&before, offset);
                let size = self.len(&before, size, 0);
                let resize = self.len(&before, resize, 0);
                let Ok(fd) = Memfd::new_in(mm.frame_pool(), "hostile", size) else {
                    return Ok(());
                };
                let prot = Prot::from_bits_retain(*prot);
                let flags = MapFlags::from_bits_retain(*flags);
                if let Ok(a) = mm.mmap_fd(addr, len, prot, flags, &fd, offset) {
                    let _ = mm.write(a, b"object");
                }
                let r = fd.set_len(resize);
                allowed(errno(&r), &[EINVAL, EFBIG, ENOMEM])?;
            }
        }
        check_layout(&self.mm.vmas(), &cfg)?;
        prop_assert_eq!(self.mm.map_count(), self.mm.vmas().len());
        Ok(())
    }

    /// `[a, a + len)` is covered by VMAs without a hole, each with `prot`
    /// if given.
    fn assert_covered(&self, a: u64, len: u64, prot: Option<Prot>) -> Result<(), TestCaseError> {
        let end = a + len;
        let mut at = a;
        for v in self.mm.vmas() {
            if v.end <= at || v.start >= end {
                continue;
            }
            prop_assert!(v.start <= at, "hole at {at:#x} in {a:#x}..{end:#x}");
            if let Some(p) = prot {
                prop_assert_eq!(v.prot, p, "protection of {:#x}..{:#x}", v.start, v.end);
            }
            at = v.end;
            if at >= end {
                break;
            }
        }
        prop_assert!(at >= end, "{a:#x}..{end:#x} not covered from {at:#x}");
        Ok(())
    }
}

/// The VMAs are sorted, disjoint, page-aligned, non-empty, at or above
/// `mmap_min_addr` and below the task size.
fn check_layout(vmas: &[VmaInfo], cfg: &Config) -> Result<(), TestCaseError> {
    let mut prev_end = 0;
    for v in vmas {
        prop_assert!(v.start < v.end, "empty VMA {:#x}..{:#x}", v.start, v.end);
        prop_assert!(
            v.start % PAGE_SIZE == 0 && v.end % PAGE_SIZE == 0,
            "unaligned VMA {:#x}..{:#x}",
            v.start,
            v.end
        );
        prop_assert!(
            v.start >= prev_end,
            "VMA {:#x} overlaps or is out of order",
            v.start
        );
        prop_assert!(
            v.start >= cfg.mmap_min_addr,
            "VMA {:#x} below mmap_min_addr",
            v.start
        );
        prop_assert!(
            v.end <= cfg.task_size,
            "VMA ends at {:#x}, past the task size",
            v.end
        );
        prev_end = v.end;
    }
    Ok(())
}

/// `vmas` with the pieces of a split put back together: neighbours that
/// continue each other (same flags, object and name, contiguous offsets).
fn unsplit(vmas: &[VmaInfo]) -> Vec<VmaInfo> {
    let mut out: Vec<VmaInfo> = Vec::new();
    for v in vmas {
        if let Some(p) = out.last_mut() {
            let same = VmaInfo {
                start: v.start,
                end: v.end,
                pgoff: v.pgoff,
                anon_vma: v.anon_vma,
                heap: v.heap,
                ..p.clone()
            } == *v;
            if p.end == v.start && same && p.pgoff + (p.end - p.start) / PAGE_SIZE == v.pgoff {
                p.end = v.end;
                p.heap |= v.heap;
                continue;
            }
        }
        out.push(v.clone());
    }
    out
}

/// A new mapping can be made (after making room if the address space is
/// full), written and read back, and unmapped.
fn fresh_mapping_works(mm: &AddressSpace) -> Result<(), TestCaseError> {
    let len = 3 * PAGE_SIZE;
    let cfg = mm.config();
    if mm.map_count() >= cfg.max_map_count {
        let first = mm.vmas()[0].clone();
        prop_assert_eq!(mm.munmap(first.start, first.end - first.start), Ok(()));
    }
    let rw = Prot::READ | Prot::WRITE;
    let a = match mm.mmap(0, len, rw, MapFlags::PRIVATE | MapFlags::ANONYMOUS) {
        Ok(a) => a,
        Err(Error::NoMem) => {
            // Everything is mapped, or the memory budget is spent: unmap
            // whole VMAs (no split, so no new metadata is needed).
            for v in mm.vmas() {
                prop_assert_eq!(mm.munmap(v.start, v.end - v.start), Ok(()));
            }
            match mm.mmap(0, len, rw, MapFlags::PRIVATE | MapFlags::ANONYMOUS) {
                Ok(a) => a,
                // Only where another space (a fork relative) holds the
                // whole budget.
                Err(Error::NoMem) if mm.memory_used() + 4 * PAGE_SIZE > BUDGET => return Ok(()),
                Err(e) => {
                    return Err(TestCaseError::fail(format!(
                        "mmap after unmapping all: {e}"
                    )))
                }
            }
        }
        Err(e) => return Err(TestCaseError::fail(format!("fresh mmap: {e}"))),
    };
    // Earlier stores may have used the whole budget: then unmapping
    // everything else must give frames back.
    let data = pattern(0x5a, len as usize - 10);
    // Out of memory reads as ENOMEM, whatever detail the error carries.
    let nomem = |r: &Result<(), Error>| matches!(r, Err(e) if e.errno() == Error::NoMem.errno());
    if nomem(&mm.write(a + 5, &data)) {
        for v in mm.vmas() {
            // The fresh mapping may have merged with a neighbour: unmap
            // the rest of that VMA around it, and every other VMA.
            for (s, e) in [(v.start, v.end.min(a)), (v.start.max(a + len), v.end)] {
                if s < e {
                    prop_assert_eq!(mm.munmap(s, e - s), Ok(()));
                }
            }
        }
        // Still out of memory only where another space (a fork
        // relative) holds the budget.
        match mm.write(a + 5, &data) {
            r if nomem(&r) && mm.memory_used() + 4 * PAGE_SIZE > BUDGET => {
                prop_assert_eq!(mm.munmap(a, len), Ok(()));
                return Ok(());
            }
            r => prop_assert_eq!(r, Ok(())),
        }
    }
    let mut back = vec![0u8; data.len()];
    prop_assert_eq!(mm.read(a + 5, &mut back), Ok(()));
    prop_assert!(back == data, "fresh mapping read back wrong");
    prop_assert_eq!(mm.munmap(a, len), Ok(()));
    Ok(())
}

/// A number from the environment: `HOSTILE_CASES` and `HOSTILE_SEED` let a
/// longer hunt run other cases than CI's fixed, reproducible set.
fn hunt_var(name: &str) -> Option<u64> {
    std::env::var(name).ok()?.parse().ok()
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: hunt_var("HOSTILE_CASES").map_or(256, |n| n as u32),
        max_shrink_iters: 4000,
        // Reproducible runs, and no regression files written into the tree.
        rng_seed: proptest::test_runner::RngSeed::Fixed(hunt_var("HOSTILE_SEED").unwrap_or(0x4057_11E5)),
        failure_persistence: None,
        ..ProptestConfig::default()
    })]

    #[test]
    fn adversarial_arguments_never_break_the_address_space(
        cfg in config(),
        ops in proptest::collection::vec(op(), 1..48),
    ) {
        let mut h = Hostile::new(cfg);
        for op in &ops {
            h.apply(op)?;
        }
        fresh_mapping_works(&h.mm)?;
        let child = match h.mm.fork() {
            Ok(child) => child,
            // The budget may be spent (locked or populated memory held by
            // the parent): fork is refused and the parent left as it was.
            Err(Error::NoMem) => {
                check_layout(&h.mm.vmas(), h.mm.config())?;
                return fresh_mapping_works(&h.mm);
            }
            Err(e) => return Err(TestCaseError::fail(format!("fork: {e}"))),
        };
        check_layout(&child.vmas(), child.config())?;
        fresh_mapping_works(&child)?;
    }
}

// ---------------------------------------------------------------- regressions

/// One call with raw Linux arguments, for the regression cases.
#[derive(Clone, Copy, Debug)]
enum Call {
    Mremap(u64, u64, u64, u32, u64),
}

impl Call {
    fn on(self, t: &mut dyn Target) -> Res<u64> {
        match self {
            Call::Mremap(a, ol, nl, f, na) => t.mremap(a, ol, nl, f, na),
        }
    }

    /// The call as a raw system call: only async-signal-safe work, as it
    /// runs in a forked child of this multi-threaded process.
    fn raw(self) -> Res<u64> {
        // SAFETY: runs only in the forked child (see `kernel_in_child`),
        // whose memory is its own copy: whatever the call unmaps or
        // changes, this process is not affected.
        let p = unsafe {
            match self {
                Call::Mremap(a, ol, nl, f, na) => libc::mremap(
                    a as *mut libc::c_void,
                    ol as usize,
                    nl as usize,
                    f as i32,
                    na as *mut libc::c_void,
                ),
            }
        };
        if p == libc::MAP_FAILED {
            // SAFETY: reading this thread's errno.
            Err(unsafe { *libc::__errno_location() })
        } else {
            Ok(p as u64)
        }
    }
}

/// Runs `call` on the kernel in a forked child of this process, on the
/// kernel region `k` (set up by the parent, inherited by the child), and
/// returns what the child saw: the result and the region's layout after
/// it. A call that would change memory it must not can only harm the
/// child, whose death fails the test. The child gives up root first:
/// aspace models an unprivileged process (no `CAP_SYS_RAWIO`, so `EPERM`
/// below `mmap_min_addr`).
fn kernel_in_child(k: &KernelTarget, call: Call) -> (Res<u64>, Vec<Vma>) {
    let mut fds = [0; 2];
    // SAFETY: `fds` is a valid array of two ints for pipe2 to fill.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the child runs only async-signal-safe code (the raw call,
    // open/read/write/_exit on a stack buffer) and never returns.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork");
    if pid == 0 {
        // SAFETY: a raw system call; failing (not root to begin with)
        // leaves the child unprivileged anyway.
        unsafe { libc::setresuid(65534, 65534, 65534) };
        let res: i64 = match call.raw() {
            Ok(v) => v as i64,
            Err(e) => -(e as i64),
        };
        let mut buf = [0u8; 4096];
        // SAFETY: raw calls on the pipe, our own stack buffer and a
        // NUL-terminated path; `_exit` does not return.
        unsafe {
            libc::write(fds[1], (&res as *const i64).cast(), 8);
            let fd = libc::open(c"/proc/self/maps".as_ptr(), libc::O_RDONLY);
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                libc::write(fds[1], buf.as_ptr().cast(), n as usize);
            }
            libc::_exit(0);
        }
    }
    let mut out = Vec::new();
    // SAFETY: closing our copy of the write end (so read_to_end sees EOF
    // when the child exits); the read end is ours alone and becomes the
    // File's to close.
    unsafe {
        libc::close(fds[1]);
        std::fs::File::from_raw_fd(fds[0])
            .read_to_end(&mut out)
            .expect("read the child's report");
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    assert_eq!(unsafe { libc::waitpid(pid, &mut status, 0) }, pid);
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "the kernel child died (status {status:#x}) on {call:?}"
    );
    let res = i64::from_ne_bytes(out[..8].try_into().unwrap());
    let res = if (-4095..0).contains(&res) {
        Err(-res as i32)
    } else {
        Ok(res as u64)
    };
    let r = k.region();
    let text = String::from_utf8_lossy(&out[8..]);
    let layout = text
        .lines()
        .filter_map(parse_maps_line)
        .filter(|v| v.start >= r.start && v.end <= r.end)
        .collect();
    (res, normalize(layout))
}

/// A layout and a result relative to the region's interior, in pages.
fn relative(r: Region, res: Res<u64>, layout: Vec<Vma>) -> (Res<i64>, Vec<(i64, i64, String)>) {
    let rel = |a: u64| (a as i64 - r.lo as i64) / PAGE_SIZE as i64;
    (
        res.map(rel),
        layout
            .into_iter()
            .map(|v| (rel(v.start), rel(v.end), v.perms))
            .collect(),
    )
}

/// Sets up a region of `pages` pages with `setup` on aspace and (where it
/// can run here) the kernel, makes `call` (built from the region) on both,
/// and returns aspace's result and interior layout after checking that
/// they are the kernel's.
fn compare(
    pages: u64,
    setup: impl Fn(&mut dyn Target),
    call: impl Fn(Region) -> Call,
) -> (Res<i64>, Vec<(i64, i64, String)>) {
    let mut a = AspaceTarget::new(Region::new(
        common::aspace_target::DEFAULT_REGION_START,
        pages,
    ));
    setup(&mut a);
    let ra = a.region();
    let c = call(ra);
    let got = c.on(&mut a);
    let layout = a.layout();
    let ours = relative(ra, got, layout);
    if let Some(mut k) = KernelTarget::new(pages) {
        setup(&mut k);
        let (res, layout) = kernel_in_child(&k, call(k.region()));
        let theirs = relative(k.region(), res, layout);
        assert_eq!(
            ours, theirs,
            "aspace (left) and the kernel (right) differ on {c:?}"
        );
    }
    ours
}

/// Maps interior pages `[i, i + n)` read-write, private.
fn map_pages(t: &mut dyn Target, i: u64, n: u64) {
    let a = t.region().page(i);
    assert_eq!(t.mmap(a, n * PAGE_SIZE, RW, ANON | MAP_FIXED), Ok(a));
}

/// mremap's shrink unmaps `[addr + new_len, addr + old_len)` through
/// munmap's checks: an old length that reaches past the task size is
/// EINVAL, and nothing changes. It overflowed `old_addr + old_len`.
#[test]
fn mremap_shrink_with_an_old_length_past_the_task_size_is_einval() {
    let (res, layout) = compare(
        300,
        |t| map_pages(t, 0, 260),
        |r| {
            Call::Mremap(
                r.page(0),
                0xffff_ffff_ffff_f000,
                0x10_0000,
                MREMAP_MAYMOVE,
                0,
            )
        },
    );
    assert_eq!(res, Err(EINVAL));
    assert_eq!(layout[1], (0, 260, "rw-p".to_string()));
    // The call from the issue, on its own.
    let mm = AddressSpace::new(Config::default());
    let rw = Prot::READ | Prot::WRITE;
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    assert_eq!(mm.mmap(0x20_0000, 0x20_0000, rw, anon), Ok(0x20_0000));
    assert_eq!(
        mm.mremap(
            0x20_0000,
            0xffff_ffff_ffff_f000,
            0x10_0000,
            MremapFlags::MAYMOVE,
            0
        ),
        Err(Error::Inval)
    );
    assert_eq!(mm.vmas().len(), 1);
    // Old lengths that round up to a wrap are 0: a grow of a private
    // mapping from nothing, EINVAL too.
    assert_eq!(
        mm.mremap(0x20_0000, u64::MAX, 0x10_0000, MremapFlags::MAYMOVE, 0),
        Err(Error::Inval)
    );
}

/// The same shrink with MREMAP_FIXED: the target is unmapped first, then
/// the shrink fails with EINVAL (Linux's order: `mremap_to` unmaps the
/// destination, then shrinks).
#[test]
fn mremap_fixed_shrink_with_an_old_length_past_the_task_size_unmaps_the_target_then_einval() {
    let (res, layout) = compare(
        64,
        |t| {
            map_pages(t, 0, 8);
            map_pages(t, 20, 4);
        },
        |r| {
            Call::Mremap(
                r.page(0),
                0xffff_ffff_ffff_f000,
                2 * PAGE_SIZE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                r.page(21),
            )
        },
    );
    assert_eq!(res, Err(EINVAL));
    let rw = |s, e| (s, e, "rw-p".to_string());
    assert_eq!(
        layout[1..layout.len() - 1],
        [rw(0, 8), rw(20, 21), rw(23, 24)]
    );
}

/// mremap's placement is checked against `mmap_min_addr` like mmap's:
/// `EPERM` for a FIXED target below it (after the target range was
/// unmapped). aspace put a VMA at 0.
#[test]
fn mremap_fixed_below_mmap_min_addr_is_eperm() {
    let (res, layout) = compare(
        16,
        |t| map_pages(t, 0, 2),
        |r| {
            Call::Mremap(
                r.page(0),
                PAGE_SIZE,
                PAGE_SIZE,
                MREMAP_MAYMOVE | MREMAP_FIXED,
                0,
            )
        },
    );
    assert_eq!(res, Err(libc::EPERM));
    assert_eq!(layout[1], (0, 2, "rw-p".to_string()));
    // Above 0 but below aspace's default minimum (64 KiB; this kernel's
    // may be lower, so aspace only).
    let mm = AddressSpace::new(Config::default());
    let rw = Prot::READ | Prot::WRITE;
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let a = mm.mmap(0, 2 * PAGE_SIZE, rw, anon).unwrap();
    let mv = MremapFlags::MAYMOVE | MremapFlags::FIXED;
    assert_eq!(
        mm.mremap(a, PAGE_SIZE, PAGE_SIZE, mv, 0x1000),
        Err(Error::Perm)
    );
    assert_eq!(
        mm.mremap(a, PAGE_SIZE, PAGE_SIZE, mv, 0xf000),
        Err(Error::Perm)
    );
    assert_eq!(
        mm.mremap(a, PAGE_SIZE, PAGE_SIZE, mv, 0x1_0000),
        Ok(0x1_0000)
    );
}

/// A DONTUNMAP hint is not raised to `mmap_min_addr` as mmap's is (Linux's
/// `round_hint_to_min` is mmap's alone): a free hint below it is taken,
/// then refused with EPERM. The kernel here cannot show it (its minimum is
/// one page, and only 0, which is no hint, lies below); this follows the
/// kernel's `vrm_set_new_addr` -> `get_unmapped_area` -> the arch's hint
/// check -> `security_mmap_addr`. mmap keeps rounding the hint up.
#[test]
fn mremap_dontunmap_hint_below_mmap_min_addr_is_eperm() {
    let mm = AddressSpace::new(Config::default());
    let rw = Prot::READ | Prot::WRITE;
    let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
    let a = mm.mmap(0, 2 * PAGE_SIZE, rw, anon).unwrap();
    let du = MremapFlags::MAYMOVE | MremapFlags::DONTUNMAP;
    assert_eq!(
        mm.mremap(a, PAGE_SIZE, PAGE_SIZE, du, 0x2000),
        Err(Error::Perm)
    );
    let before = mm.vmas();
    assert_eq!(
        mm.mremap(a, PAGE_SIZE, PAGE_SIZE, du, 0x2_0000),
        Ok(0x2_0000)
    );
    assert_eq!(mm.vmas().len(), before.len() + 1);
    assert_eq!(mm.mmap(0x2000, PAGE_SIZE, rw, anon), Ok(0x1_0000));
}

/// brk's room check adds the stack guard gap, which the embedder chooses:
/// a huge one saturates instead of overflowing (a panic in a debug build).
#[test]
fn brk_with_a_huge_stack_guard_gap_does_not_overflow() {
    let mm = AddressSpace::new(Config {
        stack_guard_gap: u64::MAX,
        ..Config::default()
    });
    let b = mm.brk(0).unwrap();
    let above = b + (1 << 30);
    let rw = Prot::READ | Prot::WRITE;
    let fixed = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    assert_eq!(mm.mmap(above, PAGE_SIZE, rw, fixed), Ok(above));
    // A plain mapping above keeps no guard gap: the heap grows.
    assert_eq!(mm.brk(b + 4 * PAGE_SIZE), Ok(b + 4 * PAGE_SIZE));
    // A stack above keeps one, all of user space: the heap may not grow.
    let stack = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::GROWSDOWN;
    let s = mm.mmap(0, PAGE_SIZE, rw, stack).unwrap();
    assert_eq!(mm.munmap(above, PAGE_SIZE), Ok(()));
    assert!(s > b);
    assert_eq!(mm.brk(b + 8 * PAGE_SIZE), Ok(b + 4 * PAGE_SIZE));
}

/// A task size `validate` refuses but `new` takes as given, `u64::MAX`,
/// puts the last page at the top of the address space: a read there, a
/// brk there (each writer locking's grow check) and a mincore rounded
/// past it saturate or fail instead of overflowing (each panicked with
/// overflow checks on).
#[test]
fn accesses_and_brk_at_the_top_of_a_task_size_of_u64_max_do_not_overflow() {
    for writer_locking in [WriterLocking::MmapLock, WriterLocking::Range] {
        let cfg = Config {
            task_size: u64::MAX,
            mmap_base: 1 << 47,
            brk_start: 0x1000,
            mmap_min_addr: 0x1000,
            writer_locking,
            ..Config::default()
        };
        assert!(cfg.validate().is_err());
        let mm = AddressSpace::new(cfg.clone());
        let mut buf = [0u8; 4095];
        assert!(mm.read(u64::MAX - 4095, &mut buf).is_err());
        assert!(mm.brk(u64::MAX - 4095).is_ok());
        // mincore's range rounded to pages passes the top: ENOMEM.
        assert_eq!(mm.mincore(u64::MAX - 8191, 8191), Err(Error::NoMem));
        // A mapping above the break: the grow check adds the page above
        // the new break, and refuses.
        let mm = AddressSpace::new(cfg);
        let rw = Prot::READ | Prot::WRITE;
        let fixed = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
        assert_eq!(mm.mmap(1 << 40, PAGE_SIZE, rw, fixed), Ok(1 << 40));
        let b = mm.brk(0).unwrap();
        assert_eq!(mm.brk(u64::MAX - 4095), Ok(b));
    }
}
