//! Differential test against the running kernel.
//!
//! Seeded random sequences of mmap (with `MAP_LOCKED`, `MAP_STACK`,
//! `MAP_DROPPABLE`, ...) / munmap / mprotect / mremap / madvise (every
//! modelled advice but `MADV_FREE` and `MADV_REMOVE`, see `Gen::madvise`)
//! / mlock, mlock2, munlock / msync / mincore / stores / loads, and two
//! memory objects (memfd_create: mmap shared, private or
//! `MAP_SHARED_VALIDATE` at random offsets, ftruncate shrinking and
//! growing them while mapped, pwrite / pread) run on the
//! real kernel (on a region of this process, see
//! `common/kernel.rs`) and on an `aspace::AddressSpace` at the same
//! addresses. After every call both sides must agree on:
//!
//! - the result: the returned address, or the errno. Placements are
//!   compared too: the kernel target confines them
//!   (`KernelTarget::confine_placements`: every gap above the region is
//!   reserved around a call that may place a mapping) and the aspace
//!   target's mmap area ends at the region's end (`AspaceTarget::confined`),
//!   so a mapping with no usable address (no hint, a hint that fails, a
//!   `MREMAP_MAYMOVE` move) goes first into the region's interior, then
//!   right below the region, on both sides; a mapping placed outside the
//!   region must be at the same offset from it on both sides, its first
//!   pages must load the same bytes, then both sides unmap it. The region
//!   starts 3 pages past a 2 MiB boundary, so that a mapping placed below
//!   it shows whether it was 2 MiB-aligned (Linux 6.7+ aligns private
//!   anonymous mappings of 2 MiB multiples, `mm/placement.rs`); the
//!   generator asks for such lengths now and then;
//! - the VMA layout inside the region (boundaries, `rwxp/s`, the offset
//!   column and the shared-object identity);
//! - the VMA flags aspace models (`MODELLED_FLAGS` of
//!   `/proc/self/smaps`: `rd wr ex sh mr mw me ms gd ac nr lo lf dc wf dd
//!   dp hg nh sr rr sf`);
//! - the bytes loaded: every page ever stored to or mapped from an object
//!   (followed through mremap moves) is loaded on both sides every few
//!   calls and at the end, and must give the same bytes or the same EFAULT
//!   (SIGBUS past an object's end).
//!
//! One allowance, on purpose: when a store spanning several pages fails,
//! the kernel (like a real `memcpy`) has written the pages before the
//! faulting one, while aspace may have written nothing. The harness then
//! checks that those pages hold either the old bytes or the stored ones on
//! the aspace side and copies the kernel's bytes over, so that both sides
//! go on from the same state. Every such resync is counted in the output.
//! Likewise, a failed load or store has faulted in (on the kernel side)
//! the pages before the failing one, which mincore shows: the harness
//! repeats the access page by page on the aspace side up to the failing
//! page (counted as "mirrored").
//!
//! Reproduce a failure: `KDIFF_SEED=<seed> cargo test --release --test
//! kernel_diff -- --nocapture` (add `KDIFF_VERBOSE=1` to print every call).
//! `KDIFF_SEQS` / `KDIFF_OPS` change the number of sequences / calls per
//! sequence; `KDIFF_FIRST_SEED` the first seed; `KDIFF_SHRINK_BUDGET` the
//! number of replayed calls spent shrinking failing sequences (0: none).

mod common;

use common::gen::Gen;
use common::ops::{apply, ObjMapping, Op, Outcome};
use common::*;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;

use common::gen::PAGES;
/// Canonical region start: sequences are generated and printed for a region
/// here and translated to wherever the kernel target's region is.
const CANON: u64 = 0x2000_0000_0000;
/// Sequences and calls per sequence by default (about 6000 calls).
const DEFAULT_SEQS: u64 = 40;
const DEFAULT_OPS: usize = 150;
/// Loaded bytes are compared every this many calls (and at the end).
const DATA_EVERY: usize = 4;
/// Budget, in replayed calls, for shrinking a failing sequence.
const SHRINK_BUDGET: usize = 40_000;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

fn out(s: &str) {
    // Straight to stderr: shows even when the harness captures output.
    let _ = writeln!(std::io::stderr(), "{s}");
}

/// The kernel whose behaviour aspace models where Linux changed it
/// recently: since 6.17 an `MREMAP_FIXED` move without resize may span
/// several VMAs. On an older kernel such calls are not generated (said once
/// on stderr), everything else is compared as usual.
const MODELLED_KERNEL: (u32, u32) = (6, 17);

/// A call whose result depends on the kernel version (see
/// [`MODELLED_KERNEL`]): a same-size mremap to a new address whose old
/// range crosses the end of its VMA.
fn version_sensitive(op: Op, layout: &[Vma]) -> bool {
    let Op::Mremap {
        old,
        old_len,
        new_len,
        flags,
        ..
    } = op
    else {
        return false;
    };
    let moves = flags & (MREMAP_FIXED | MREMAP_DONTUNMAP) != 0;
    let same = page_align(old_len).is_some() && page_align(old_len) == page_align(new_len);
    let crosses = layout
        .iter()
        .find(|v| v.start <= old && old < v.end)
        .is_some_and(|v| page_align(old_len).is_some_and(|l| old.saturating_add(l) > v.end));
    let sensitive = moves && same && crosses;
    if sensitive {
        static ONCE: std::sync::Once = std::sync::Once::new();
        ONCE.call_once(|| {
            out(&format!(
                "kernel_diff: Linux {} is older than {}.{}: multi-VMA mremap moves are not generated",
                kernel::kernel_release(),
                MODELLED_KERNEL.0,
                MODELLED_KERNEL.1
            ))
        });
    }
    sensitive
}

/// Moves canonical-region addresses of `op` by `delta` (other addresses:
/// 0, the task-size edge, ... stay as they are).
fn rebase(op: Op, delta: u64) -> Op {
    let span = CANON..CANON + (PAGES + 2) * PAGE;
    let mv = |a: u64| {
        if span.contains(&(a & !(PAGE - 1))) {
            a + delta
        } else {
            a
        }
    };
    match op {
        Op::Mmap {
            addr,
            len,
            prot,
            flags,
        } => Op::Mmap {
            addr: mv(addr),
            len,
            prot,
            flags,
        },
        Op::Munmap { addr, len } => Op::Munmap {
            addr: mv(addr),
            len,
        },
        Op::Mprotect { addr, len, prot } => Op::Mprotect {
            addr: mv(addr),
            len,
            prot,
        },
        Op::Mremap {
            old,
            old_len,
            new_len,
            flags,
            new_addr,
        } => Op::Mremap {
            old: mv(old),
            old_len,
            new_len,
            flags,
            new_addr: mv(new_addr),
        },
        Op::Madvise { addr, len, advice } => Op::Madvise {
            addr: mv(addr),
            len,
            advice,
        },
        Op::Write { addr, len, seed } => Op::Write {
            addr: mv(addr),
            len,
            seed,
        },
        Op::Read { addr, len } => Op::Read {
            addr: mv(addr),
            len,
        },
        Op::Mlock { addr, len, flags } => Op::Mlock {
            addr: mv(addr),
            len,
            flags,
        },
        Op::Munlock { addr, len } => Op::Munlock {
            addr: mv(addr),
            len,
        },
        Op::Msync { addr, len, flags } => Op::Msync {
            addr: mv(addr),
            len,
            flags,
        },
        Op::Mincore { addr, len } => Op::Mincore {
            addr: mv(addr),
            len,
        },
        Op::MmapObj(m) => Op::MmapObj(ObjMapping {
            addr: mv(m.addr),
            ..m
        }),
        Op::Truncate { .. } | Op::ObjWrite { .. } | Op::ObjRead { .. } => op,
    }
}

/// Moves a layout back to canonical addresses.
fn canon_layout(v: Vec<Vma>, delta: u64) -> Vec<Vma> {
    v.into_iter()
        .map(|mut m| {
            m.start -= delta;
            m.end -= delta;
            m
        })
        .collect()
}

/// The pair of targets and what is compared after each call.
struct Pair {
    k: KernelTarget,
    a: AspaceTarget,
    delta: u64,
    /// Canonical page addresses whose bytes are compared.
    pages: BTreeSet<u64>,
    /// Layout after the last call (canonical).
    layout: Vec<Vma>,
    resyncs: u64,
    /// Failed multi-page accesses whose first pages were faulted in on
    /// the aspace side as the kernel faulted them.
    mirrored: u64,
    calls: u64,
    placements: Placements,
}

/// Counts of the placements the sides chose themselves (mmap without a
/// fixed address, mremap moves without `MREMAP_FIXED`) whose results were
/// compared.
#[derive(Default, Clone, Copy)]
struct Placements {
    /// Placements compared.
    compared: u64,
    /// Of those, inside the region.
    inside: u64,
    /// Of those, on a 2 MiB boundary on the kernel side.
    aligned: u64,
    /// Placements whose results differed.
    differ: u64,
}

impl Placements {
    fn add(&mut self, o: Placements) {
        self.compared += o.compared;
        self.inside += o.inside;
        self.aligned += o.aligned;
        self.differ += o.differ;
    }
}

/// Where the region starts past a 2 MiB boundary (see the module docs).
const REGION_PHASE: u64 = 3 * PAGE;

/// A difference: what differs, with both sides' details.
struct Diff {
    step: usize,
    what: String,
}

impl Pair {
    fn new() -> Option<Pair> {
        let mut k = KernelTarget::new_at_phase(PAGES, REGION_PHASE)?;
        k.confine_placements();
        let region = k.region();
        let a = AspaceTarget::confined(region);
        let mut p = Pair {
            delta: region.start - CANON,
            k,
            a,
            pages: BTreeSet::new(),
            layout: Vec::new(),
            resyncs: 0,
            mirrored: 0,
            calls: 0,
            placements: Placements::default(),
        };
        p.layout = canon_layout(p.k.layout(), p.delta);
        Some(p)
    }

    fn both_layouts(&mut self) -> String {
        let mut s = String::from("  kernel layout:\n");
        s += &dump(&mut self.k);
        s += "  aspace layout:\n";
        s += &dump(&mut self.a);
        s
    }

    /// Runs one (canonical) call on both sides and compares.
    fn step(&mut self, step: usize, op: Op, check_data: bool, verbose: bool) -> Result<(), Diff> {
        let real = rebase(op, self.delta);
        let ok = apply(&mut self.k, real);
        let oa = apply(&mut self.a, real);
        self.calls += 1;
        if verbose {
            out(&format!("  [{step:3}] {op:?} -> {ok:?}"));
        }
        if op.places() {
            let region = self.k.region();
            let at = match &ok {
                Outcome::At(rel) => Some((true, region.start + rel)),
                Outcome::Outside(rel, _) => Some((false, region.start.wrapping_add(*rel))),
                _ => None,
            };
            // An mremap that stayed (grew in place, shrank) placed nothing.
            let moved = match real {
                Op::Mremap { old, .. } => at.map(|a| a.1) != Some(old),
                _ => true,
            };
            if let (Some((inside, a)), true) = (at, moved) {
                self.placements.compared += 1;
                self.placements.inside += u64::from(inside);
                self.placements.aligned += u64::from(a % (2 << 20) == 0);
                self.placements.differ += u64::from(ok != oa);
            }
        }
        if ok != oa {
            return Err(Diff {
                step,
                what: format!(
                    "result differs for {op:?}\n  kernel: {ok:?}\n  aspace: {oa:?}\n{}",
                    self.both_layouts()
                ),
            });
        }
        if let (Op::Write { addr, len, .. }, Outcome::Err(_)) = (op, &ok) {
            self.resync_failed_store(step, addr + self.delta, len)?;
        }
        if let (Op::Read { .. } | Op::Write { .. }, Outcome::Err(_)) = (op, &ok) {
            self.mirror_partial_access(real);
        }
        let lk = self.k.layout();
        let la = self.a.layout();
        if lk != la {
            return Err(Diff {
                step,
                what: format!(
                    "layout differs after {op:?} (result {ok:?})\n{}",
                    self.both_layouts()
                ),
            });
        }
        let fk = self.k.vm_flags();
        let fa = self.a.vm_flags();
        if fk != fa {
            let mut w = format!("VmFlags differ after {op:?} (result {ok:?})\n");
            for (s, e, f) in fk.unwrap_or_default() {
                let _ = writeln!(
                    w,
                    "  kernel {:x}-{:x} {}",
                    s - self.delta,
                    e - self.delta,
                    f.join(" ")
                );
            }
            for (s, e, f) in fa.unwrap_or_default() {
                let _ = writeln!(
                    w,
                    "  aspace {:x}-{:x} {}",
                    s - self.delta,
                    e - self.delta,
                    f.join(" ")
                );
            }
            return Err(Diff { step, what: w });
        }
        self.layout = canon_layout(lk, self.delta);
        self.track(op, &ok);
        if check_data {
            self.compare_pages(step)?;
        }
        Ok(())
    }

    /// Follows the pages to compare through stores and moves.
    fn track(&mut self, op: Op, res: &Outcome) {
        match (op, res) {
            // A mapped object's pages change through the object and its
            // other mappings: compare all of them.
            (Op::MmapObj(m), Outcome::At(rel)) => {
                let start = CANON + rel;
                let end = start.saturating_add(page_align(m.len).unwrap_or(0));
                let mut p = start;
                while p < end && p < CANON + (PAGES + 2) * PAGE {
                    self.pages.insert(p);
                    p += PAGE;
                }
            }
            (Op::Write { addr, len, .. }, _) => {
                let first = addr & !(PAGE - 1);
                let mut p = first;
                while p < addr + len {
                    if (CANON..CANON + (PAGES + 2) * PAGE).contains(&p) {
                        self.pages.insert(p);
                    }
                    p += PAGE;
                }
            }
            (
                Op::Mremap {
                    old,
                    old_len,
                    new_len,
                    ..
                },
                Outcome::At(rel),
            ) => {
                let new = CANON + rel;
                if new != old {
                    let n = page_align(old_len.min(new_len)).unwrap_or(0);
                    let moved: Vec<u64> = self
                        .pages
                        .range(old..old.saturating_add(n))
                        .copied()
                        .collect();
                    for p in moved {
                        self.pages.insert(p - old + new);
                    }
                }
            }
            _ => {}
        }
    }

    /// Loads every tracked page that is mapped (a load from a hole could
    /// grow a stack: the comparison must not change the layout) on both
    /// sides.
    fn compare_pages(&mut self, step: usize) -> Result<(), Diff> {
        let pages: Vec<u64> = self
            .pages
            .iter()
            .copied()
            .filter(|&p| self.layout.iter().any(|v| v.start <= p && p < v.end))
            .collect();
        for p in pages {
            let real = p + self.delta;
            let k = read_vec(&mut self.k, real, PAGE as usize);
            let a = read_vec(&mut self.a, real, PAGE as usize);
            if k != a {
                let show = |r: &Res<Vec<u8>>| match r {
                    Ok(b) => format!("{:?}", common::ops::Bytes(b.clone())),
                    Err(e) => format!("errno {e}"),
                };
                let first = match (&k, &a) {
                    (Ok(x), Ok(y)) => x
                        .iter()
                        .zip(y)
                        .position(|(a, b)| a != b)
                        .map(|i| format!(" (first difference at byte {i:#x})")),
                    _ => None,
                }
                .unwrap_or_default();
                return Err(Diff {
                    step,
                    what: format!(
                        "bytes of page {p:#x} differ{first}\n  kernel: {}\n  aspace: {}\n{}",
                        show(&k),
                        show(&a),
                        self.both_layouts()
                    ),
                });
            }
        }
        Ok(())
    }

    /// After a failed load or store: the kernel faulted in the pages
    /// before the failing one (a read fault maps the zero page, which
    /// mincore sees), aspace none of them (it checks the whole range
    /// first). The same access, page by page on the aspace side until a
    /// page fails, faults in what the kernel did (and stores the bytes the
    /// kernel stored, which the resync has already put there).
    fn mirror_partial_access(&mut self, op: Op) {
        let (addr, len, data) = match op {
            Op::Read { addr, len } => (addr, len, None),
            Op::Write { addr, len, seed } => (addr, len, Some(pattern(seed, addr, len as usize))),
            _ => return,
        };
        let end = addr + len;
        let mut a = addr;
        let mut mirrored = false;
        while a < end {
            let n = ((a / PAGE + 1) * PAGE).min(end) - a;
            let off = (a - addr) as usize;
            let r = match &data {
                Some(d) => self.a.write(a, &d[off..off + n as usize]),
                None => read_vec(&mut self.a, a, n as usize).map(drop),
            };
            if r.is_err() {
                break;
            }
            mirrored = true;
            a += n;
        }
        if mirrored {
            self.mirrored += 1;
        }
    }

    /// After a failed store: the kernel may have written the pages before
    /// the faulting one. aspace must hold, in each of them, either its old
    /// bytes or exactly what the kernel holds; then the kernel's bytes are
    /// copied over (see the module docs).
    fn resync_failed_store(&mut self, step: usize, addr: u64, len: u64) -> Result<(), Diff> {
        // Only mapped pages: a load from a hole could grow a stack.
        let mapped = self.k.layout();
        let first = addr & !(PAGE - 1);
        let mut p = first;
        while p < addr + len {
            if !mapped.iter().any(|v| v.start <= p && p < v.end) {
                p += PAGE;
                continue;
            }
            let k = read_vec(&mut self.k, p, PAGE as usize);
            let a = read_vec(&mut self.a, p, PAGE as usize);
            match (k, a) {
                (Ok(k), Ok(a)) if k != a => {
                    // The aspace page must be untouched by the store: its
                    // bytes outside the stored range equal the kernel's, and
                    // the kernel got the store there.
                    let s = addr.max(p) - p;
                    let e = (addr + len).min(p + PAGE) - p;
                    let outside_same =
                        k[..s as usize] == a[..s as usize] && k[e as usize..] == a[e as usize..];
                    if !outside_same {
                        return Err(Diff {
                            step,
                            what: format!("after a failed store, page {p:#x} differs outside the stored bytes\n{}", self.both_layouts()),
                        });
                    }
                    if let Err(e) = self.a.write(p, &k) {
                        return Err(Diff {
                            step,
                            what: format!(
                                "after a failed store the kernel wrote page {p:#x}, but aspace cannot store there (errno {e})\n{}",
                                self.both_layouts()
                            ),
                        });
                    }
                    self.resyncs += 1;
                }
                (k, a) if k.is_ok() != a.is_ok() => {
                    return Err(Diff {
                        step,
                        what: format!(
                            "after a failed store, page {p:#x} loads on one side only (kernel {:?}, aspace {:?})\n{}",
                            k.err(),
                            a.err(),
                            self.both_layouts()
                        ),
                    });
                }
                _ => {}
            }
            p += PAGE;
        }
        Ok(())
    }
}

/// Runs `ops` (or generates `n` calls from `seed` when `ops` is None).
/// Returns the calls run and the first difference.
fn run(
    seed: u64,
    n: usize,
    fixed: Option<&[Op]>,
    verbose: bool,
) -> Option<(Vec<Op>, Option<Diff>, Pair)> {
    let mut pair = Pair::new()?;
    let mut gen = Gen::new(seed ^ 0x5EED_0000_0000, Region::new(CANON, PAGES));
    let mut done = Vec::new();
    let total = fixed.map_or(n, |f| f.len());
    let modern = kernel::kernel_version() >= MODELLED_KERNEL;
    for i in 0..total {
        gen.vmas = pair.layout.clone();
        let op = match fixed {
            Some(f) => f[i],
            None => gen.op(),
        };
        if fixed.is_none() && !modern && version_sensitive(op, &pair.layout) {
            continue;
        }
        let step = done.len();
        done.push(op);
        let check = fixed.is_some() || i % DATA_EVERY == DATA_EVERY - 1 || i + 1 == total;
        if let Err(d) = pair.step(step, op, check, verbose) {
            return Some((done, Some(d), pair));
        }
    }
    if let Err(d) = pair.compare_pages(done.len()) {
        return Some((done, Some(d), pair));
    }
    Some((done, None, pair))
}

/// Greedy shrinking: drops chunks of calls while a difference remains.
fn shrink(ops: Vec<Op>, budget: &mut usize) -> Vec<Op> {
    let fails = |ops: &[Op], budget: &mut usize| -> bool {
        if *budget < ops.len() {
            return false;
        }
        *budget -= ops.len();
        matches!(run(0, 0, Some(ops), false), Some((_, Some(_), _)))
    };
    let mut cur = ops;
    let mut chunk = (cur.len() / 2).max(1);
    while chunk >= 1 && *budget > cur.len() {
        let mut i = 0;
        let mut progressed = false;
        while i < cur.len() && *budget > cur.len() {
            let mut cand = cur.clone();
            let end = (i + chunk).min(cand.len());
            // Never drop the failing (last) call.
            if end == cand.len() {
                break;
            }
            cand.drain(i..end);
            if fails(&cand, budget) {
                cur = cand;
                progressed = true;
            } else {
                i += chunk;
            }
        }
        if !progressed {
            if chunk == 1 {
                break;
            }
            chunk /= 2;
        }
    }
    cur
}

fn report(seed: u64, ops: &[Op], d: &Diff) -> String {
    let mut s = format!(
        "seed {seed}: difference at call {}:\n{}\n  calls so far:\n",
        d.step, d.what
    );
    for (i, op) in ops.iter().enumerate() {
        let _ = writeln!(s, "    [{i:3}] {op:?}");
    }
    let _ = writeln!(
        s,
        "  reproduce: KDIFF_SEED={seed} KDIFF_VERBOSE=1 cargo test --release --test kernel_diff -- --nocapture"
    );
    s
}

#[test]
fn kernel_and_aspace_agree_on_random_sequences() {
    if Pair::new().is_none() {
        return; // the reason was printed
    }
    let verbose = env_u64("KDIFF_VERBOSE").is_some_and(|v| v != 0);
    let nops = env_u64("KDIFF_OPS").map_or(DEFAULT_OPS, |v| v as usize);
    let seeds: Vec<u64> = match env_u64("KDIFF_SEED") {
        Some(s) => vec![s],
        None => {
            let first = env_u64("KDIFF_FIRST_SEED").unwrap_or(1);
            (first..first + env_u64("KDIFF_SEQS").unwrap_or(DEFAULT_SEQS)).collect()
        }
    };
    let mut failures = Vec::new();
    let mut calls = 0;
    let mut resyncs = 0;
    let mut mirrored = 0;
    let mut placements = Placements::default();
    let mut shrink_budget = env_u64("KDIFF_SHRINK_BUDGET").map_or(SHRINK_BUDGET, |v| v as usize);
    for &seed in &seeds {
        if verbose {
            out(&format!("seed {seed}:"));
        }
        let (ops, diff, pair) = run(seed, nops, None, verbose).expect("kernel target");
        calls += pair.calls;
        resyncs += pair.resyncs;
        mirrored += pair.mirrored;
        placements.add(pair.placements);
        if let Some(d) = diff {
            let mut msg = report(seed, &ops, &d);
            if shrink_budget > 0 {
                let small = shrink(ops.clone(), &mut shrink_budget);
                if small.len() < ops.len() {
                    if let Some((small, Some(d2), _)) = run(0, 0, Some(&small), false) {
                        let _ = writeln!(
                            msg,
                            "  shrunk to {} calls (replayed with data checks after every call):",
                            small.len()
                        );
                        let _ = writeln!(msg, "{}", d2.what);
                        for (i, op) in small.iter().enumerate() {
                            let _ = writeln!(msg, "    [{i:3}] {op:?}");
                        }
                    }
                }
            }
            out(&msg);
            failures.push(seed);
        }
    }
    out(&format!(
        "kernel_diff: {} sequences, {calls} calls compared, {resyncs} failed multi-page store(s) resynced, {mirrored} failed multi-page access(es) mirrored, {} sequence(s) with differences",
        seeds.len(),
        failures.len()
    ));
    out(&format!(
        "kernel_diff: {} placements chosen by the kernel compared ({} in the region, {} below it, {} 2 MiB-aligned), {} differing",
        placements.compared,
        placements.inside,
        placements.compared - placements.inside,
        placements.aligned,
        placements.differ
    ));
    assert!(
        failures.is_empty(),
        "aspace differs from Linux {} in {} of {} sequences: seeds {failures:?} (details above)",
        kernel::kernel_release(),
        failures.len(),
        seeds.len()
    );
}
