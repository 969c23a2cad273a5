//! Random call sequences in disjoint zones of one address space, run at
//! once (one thread a zone), must give each zone exactly what the same
//! sequence gives when it runs alone in a space of its own.
//!
//! The calls come from `kernel_diff`'s generator (`common/gen.rs`): mmap
//! with its flags, munmap, mprotect, mremap, madvise, the lock calls,
//! msync, mincore, loads and stores, and two memory objects per zone
//! (their mappings, `ftruncate`, `pwrite`, `pread`), mostly valid, some
//! deliberately bad. Each zone's sequence first runs alone, in a fresh
//! space with the same configuration, and its results are recorded: every
//! call's outcome (the errno, the bytes loaded, the residency), then the
//! zone's VMA layout and the bytes of every page. Then every zone's
//! sequence runs at once in one shared space, and each call must give the
//! recorded outcome, and each zone the recorded layout and bytes.
//!
//! A writer that changed another zone's VMAs, a lock that let two
//! writers into one VMA or page table, a lock-free reader that read a VMA
//! mid-change, or data lost or misplaced by a concurrent call shows up as
//! a different outcome. Zones are far enough apart that no call's result
//! may depend on another zone (more than a stack guard gap), yet in one
//! range-lock shard, so that munmap's holes (which reach the VMAs on
//! either side) meet, and one zone lies in another 512 GiB shard; or
//! (with the bias) each in a shard of its own, so that every thread
//! owns its slot's bias. Only
//! calls whose effect stays inside their zone are kept: no placements
//! (mmap without a fixed address, mremap moves without `MREMAP_FIXED`:
//! where they land depends on the other zones) and no ranges that leave
//! the zone; the lock limit is unlimited (one budget for all zones).
//!
//! Every writer-locking mode runs: `MmapLock` (every writer excludes the
//! rest), and `Range` with and without its bias (writers on disjoint
//! ranges at once; with the bias, in both layouts), each with the
//! default speculative faults, and `Range` with per-VMA faults. `CZ_SEQS` (default 6) sets the rounds per mode,
//! `CZ_OPS` (default 400) the calls per zone, `CZ_FIRST_SEED` the first
//! seed.

mod common;

use aspace::{AddressSpace, Config, FaultLocking, WriterLocking};
use common::gen::{Gen, PAGES};
use common::ops::{apply, Op, Outcome};
use common::*;
use std::sync::{Arc, Barrier};
use std::time::Instant;

/// Zones per round (one thread each).
const ZONES: u64 = 4;
/// Where the first zone starts.
const BASE: u64 = 0x2000_0000_0000;
/// From one zone's start to the next one's: the zone and 4 MiB, past a
/// stack guard gap (1 MiB) from any call of the zone below.
const STRIDE: u64 = (PAGES + 2) * PAGE + (4 << 20);
/// One range-lock shard (and forest slot): the last zone lies in the next.
const SHARD: u64 = 512 << 30;

fn env_u64(name: &str) -> Option<u64> {
    std::env::var(name).ok().and_then(|v| v.trim().parse().ok())
}

/// Where the zones lie.
#[derive(Clone, Copy, Debug)]
enum Layout {
    /// All but the last in one shard, a stride apart; the last in the next.
    Packed,
    /// Each in a shard of its own, 1 GiB inside it: with the range lock's
    /// bias, every zone's thread then owns its slot's bias for the whole
    /// round ("Slot biases" in `src/mm/range_bias.rs`).
    Spread,
}

/// Zone `k`'s region.
fn zone(k: u64, layout: Layout) -> Region {
    match layout {
        Layout::Spread => Region::new(BASE + k * SHARD + (1 << 30), PAGES),
        Layout::Packed if k + 1 == ZONES => Region::new(BASE + SHARD, PAGES),
        Layout::Packed => Region::new(BASE + k * STRIDE, PAGES),
    }
}

/// True if `[addr, addr + len)` (whole pages) lies inside `r`.
fn inside(r: &Region, addr: u64, len: u64) -> bool {
    page_align(len)
        .is_some_and(|len| addr >= r.start && addr.checked_add(len).is_some_and(|end| end <= r.end))
}

/// True if `op` acts on `r` alone, whatever the other zones hold: it
/// places nothing, and every range it names (for an mremap, the old range
/// at its larger size, and a fixed target) lies in `r`.
fn confined(op: Op, r: &Region) -> bool {
    if op.places() {
        return false;
    }
    match op {
        Op::Mmap { addr, len, .. } => inside(r, addr, len),
        Op::MmapObj(m) => inside(r, m.addr, m.len),
        Op::Mremap {
            old,
            old_len,
            new_len,
            flags,
            new_addr,
        } => {
            inside(r, old, old_len.max(new_len))
                && (flags & MREMAP_FIXED == 0 || inside(r, new_addr, new_len))
        }
        Op::Munmap { addr, len }
        | Op::Mprotect { addr, len, .. }
        | Op::Madvise { addr, len, .. }
        | Op::Write { addr, len, .. }
        | Op::Read { addr, len }
        | Op::Mlock { addr, len, .. }
        | Op::Munlock { addr, len }
        | Op::Msync { addr, len, .. }
        | Op::Mincore { addr, len } => inside(r, addr, len),
        // Each zone's target has objects of its own.
        Op::Truncate { .. } | Op::ObjWrite { .. } | Op::ObjRead { .. } => true,
    }
}

/// The bytes of every page of `t`'s region (or the errno of its load).
fn pages(t: &mut AspaceTarget) -> Vec<Outcome> {
    let r = t.region();
    (0..(r.end - r.start) / PAGE)
        .map(|i| {
            apply(
                t,
                Op::Read {
                    addr: r.start + i * PAGE,
                    len: PAGE,
                },
            )
        })
        .collect()
}

/// A zone's sequence and what it gave alone.
struct Script {
    region: Region,
    steps: Vec<(Op, Outcome)>,
    layout: Vec<Vma>,
    data: Vec<Outcome>,
}

/// Generates `n` confined calls from `seed` for `region`, running them
/// alone in a fresh space made with `cfg`, and records what they gave.
fn script(cfg: &Config, region: Region, seed: u64, n: usize) -> Script {
    let mut t = AspaceTarget::with_config(region, cfg.clone());
    let mut gen = Gen::new(seed, region);
    let mut steps = Vec::with_capacity(n);
    // The generator is aimed at the region but proposes placements and
    // out-of-range calls too: bounded, in case a layout makes most of
    // its proposals leave the zone.
    for _ in 0..n * 20 {
        if steps.len() == n {
            break;
        }
        gen.vmas = t.layout();
        let op = gen.op();
        if confined(op, &region) {
            let o = apply(&mut t, op);
            steps.push((op, o));
        }
    }
    assert!(
        steps.len() * 2 >= n,
        "seed {seed}: only {} confined calls",
        steps.len()
    );
    Script {
        region,
        steps,
        layout: t.layout(),
        data: pages(&mut t),
    }
}

/// One round: every zone's script alone, then all at once in one space.
/// Returns the calls run and whether every zone's run overlapped every
/// other's in time.
fn round(name: &str, cfg: &Config, layout: Layout, seed: u64, n: usize) -> (usize, bool) {
    let scripts: Vec<Script> = (0..ZONES)
        .map(|k| script(cfg, zone(k, layout), seed * ZONES + k, n))
        .collect();
    let mm = Arc::new(AddressSpace::new(cfg.clone()));
    let mut targets: Vec<AspaceTarget> = scripts
        .iter()
        .map(|s| AspaceTarget::in_space(mm.clone(), s.region))
        .collect();
    let start = Barrier::new(ZONES as usize);
    let spans: Vec<(Instant, Instant)> = std::thread::scope(|sc| {
        let runs: Vec<_> = targets
            .iter_mut()
            .zip(&scripts)
            .enumerate()
            .map(|(k, (t, s))| {
                let start = &start;
                sc.spawn(move || {
                    start.wait();
                    let began = Instant::now();
                    for (i, (op, want)) in s.steps.iter().enumerate() {
                        let got = apply(t, *op);
                        assert_eq!(
                            &got, want,
                            "{name}, seed {seed}, zone {k}, call {i}: {op:?} gave {got:?} beside the other zones, {want:?} alone"
                        );
                    }
                    (began, Instant::now())
                })
            })
            .collect();
        runs.into_iter()
            .map(|h| h.join().expect("a zone's run panicked"))
            .collect()
    });
    let latest_start = spans.iter().map(|s| s.0).max().expect("zones");
    let first_end = spans.iter().map(|s| s.1).min().expect("zones");
    for (k, (t, s)) in targets.iter_mut().zip(&scripts).enumerate() {
        assert!(
            t.layout() == s.layout,
            "{name}, seed {seed}, zone {k}: the layout beside the other zones\n{}differs from the one alone\n{}",
            dump(t),
            s.layout
                .iter()
                .map(|v| format!("    {v:?}\n"))
                .collect::<String>()
        );
        let got = pages(t);
        for (p, (g, w)) in got.iter().zip(&s.data).enumerate() {
            assert_eq!(
                g, w,
                "{name}, seed {seed}, zone {k}: page {p} of the zone beside the other zones, alone"
            );
        }
    }
    let calls = scripts.iter().map(|s| s.steps.len()).sum();
    (calls, latest_start < first_end)
}

#[test]
fn zones_run_at_once_give_what_each_gives_alone() {
    let seqs = env_u64("CZ_SEQS").unwrap_or(6);
    let n = env_u64("CZ_OPS").map_or(400, |v| v as usize);
    let first = env_u64("CZ_FIRST_SEED").unwrap_or(1);
    let cfg = |writers, bias, faults| Config {
        writer_locking: writers,
        range_bias: bias,
        fault_locking: faults,
        memlock_limit: u64::MAX,
        ..Config::default()
    };
    let modes = [
        (
            "MmapLock writers",
            cfg(WriterLocking::MmapLock, true, FaultLocking::Speculative),
            Layout::Packed,
        ),
        (
            "Range writers",
            cfg(WriterLocking::Range, false, FaultLocking::Speculative),
            Layout::Packed,
        ),
        (
            "Range writers with the bias",
            cfg(WriterLocking::Range, true, FaultLocking::Speculative),
            Layout::Packed,
        ),
        (
            "Range writers with the bias, a slot a zone",
            cfg(WriterLocking::Range, true, FaultLocking::Speculative),
            Layout::Spread,
        ),
        (
            "Range writers, per-VMA faults",
            cfg(WriterLocking::Range, false, FaultLocking::PerVma),
            Layout::Packed,
        ),
    ];
    for (name, c, layout) in &modes {
        let (mut calls, mut together) = (0, 0);
        for seed in first..first + seqs {
            let (n, all) = round(name, c, *layout, seed, n);
            calls += n;
            together += u64::from(all);
        }
        eprintln!(
            "concurrent_zones: {name}: {seqs} rounds of {ZONES} zones, {calls} calls, \
             every zone running at once in {together} rounds"
        );
    }
}
