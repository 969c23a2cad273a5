//! emulator: the memory side of a qemu-user-style emulator on aspace, end
//! to end.
//!
//! ```text
//! cargo run --release --example emulator -- [--threads N] [--rounds R] [--loads N] [--program PATH]
//! ```
//!
//! 1. **exec**: loads a real program (`/bin/true` by default) as Linux's
//!    exec lays it out, fetches its first instruction bytes through a
//!    translator, plants a debugger breakpoint with a forced write into
//!    its read-execute text (no VMA split), and shows that fetching from
//!    the stack (NX) raises `SIGSEGV`/`SEGV_ACCERR`.
//! 2. **guest threads**: N guest CPUs, each a `Cpu` owning its space and
//!    its translator (`Translator::new_owned`) and running on its own
//!    thread, forward mmap/mprotect/munmap to one syscall thread over a
//!    channel; each round a CPU maps 256 KiB, stores and loads every
//!    width on every page (each page's four accesses one translator
//!    `Block`, as a guest basic block), adds to a shared counter at a misaligned
//!    offset inside a cache line (`lock xadd` at `+2`), write-protects
//!    its block and turns the store fault into a siginfo, then unmaps.
//!    Every value stored is read back.
//! 3. **fork and exec**: the guest forks; the child writes its copy of
//!    the counter page (copy-on-write), then execs the program again.
//! 4. **figures**: ns per aligned load and store by width through a
//!    guest CPU's translator against a plain `Vec`, faults per second and
//!    the speculative share, forwarded mm calls per second.

#[path = "../benches/common/machine.rs"]
mod machine;
#[path = "../benches/common/translate_workload.rs"]
mod translate_workload;

use aspace::exec::{load_elf, ExecArgs, ExecImage};
use aspace::{AddressSpace, Config, Error, MapFlags, MemoryFault, Prot, Stats, Translator};
use machine::{machine, parse_arg};
use std::sync::{mpsc, Arc};
use std::time::Instant;
use translate_workload::{
    block_pairs, loads_of, pairs, plain, plain_pairs, plain_stores, slice, stores_of, BASE,
    BLOCK_PAIRS, WORDS,
};

/// A guest's memory system call, as the emulator forwards it.
enum Syscall {
    Mmap(u64, Prot),
    Mprotect(u64, u64, Prot),
    Munmap(u64, u64),
}

/// A forwarded call and where its result goes.
struct Request(Syscall, mpsc::Sender<Result<u64, Error>>);

/// What the emulator puts in the `siginfo` of a guest fault.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct SigInfo {
    signo: i32,
    code: i32,
    addr: u64,
}

impl From<MemoryFault> for SigInfo {
    fn from(f: MemoryFault) -> Self {
        SigInfo {
            signo: f.signal().unwrap_or(0),
            code: f.si_code().unwrap_or(0),
            addr: f.addr,
        }
    }
}

/// One guest CPU: it owns the space and its soft TLB, so it moves into
/// the thread that runs it.
struct Cpu {
    id: u64,
    tlb: Translator<'static>,
    sys: mpsc::Sender<Request>,
}

/// Bytes each round maps.
const BLOCK: u64 = 256 << 10;
const PAGE: u64 = 4096;

impl Cpu {
    fn new(id: u64, mm: &Arc<AddressSpace>, sys: mpsc::Sender<Request>) -> Cpu {
        Cpu {
            id,
            tlb: Translator::new_owned(Arc::clone(mm)),
            sys,
        }
    }

    /// A system call, forwarded and waited for.
    fn syscall(&self, call: Syscall) -> Result<u64, Error> {
        let (tx, rx) = mpsc::channel();
        self.sys.send(Request(call, tx)).expect("syscall thread");
        rx.recv().expect("syscall reply")
    }

    /// `rounds` rounds of the guest workload; returns the signals taken.
    fn run(&mut self, rounds: u64, counter: u64) -> u64 {
        let mut signals = 0;
        for round in 0..rounds {
            let rw = Prot::READ | Prot::WRITE;
            let a = self.syscall(Syscall::Mmap(BLOCK, rw)).expect("mmap");
            let t = &mut self.tlb;
            // Each page's accesses are one guest basic block: a `Block`
            // pays the translator's access bookkeeping once for the four
            // (its first store misses and faults the page in). Every block
            // ends before the next forwarded syscall: the syscall thread's
            // flush would wait for an open block.
            for p in 0..BLOCK / PAGE {
                let at = a + p * PAGE;
                let v = |k| pattern(self.id, round, p, k);
                let mut b = t.block();
                b.store::<u8>(at + 1, v(1) as u8).unwrap();
                b.store::<u16>(at + 2, v(2) as u16).unwrap();
                b.store::<u32>(at + 4, v(4) as u32).unwrap();
                b.store::<u64>(at + 8, v(8)).unwrap();
            }
            // `lock xadd` at a misaligned offset inside one cache line.
            t.fetch_add::<u32>(counter + 2, 1).unwrap();
            for p in 0..BLOCK / PAGE {
                let at = a + p * PAGE;
                let v = |k| pattern(self.id, round, p, k);
                let mut b = t.block();
                assert_eq!(b.load::<u8>(at + 1).unwrap(), v(1) as u8);
                assert_eq!(b.load::<u16>(at + 2).unwrap(), v(2) as u16);
                assert_eq!(b.load::<u32>(at + 4).unwrap(), v(4) as u32);
                assert_eq!(b.load::<u64>(at + 8).unwrap(), v(8));
            }
            self.syscall(Syscall::Mprotect(a, BLOCK, Prot::READ))
                .expect("mprotect");
            let err = self.tlb.store::<u32>(a + 100, 1).unwrap_err();
            let si = SigInfo::from(err);
            assert_eq!((si.signo, si.code, si.addr), (11, 2, a + 100));
            signals += 1;
            self.syscall(Syscall::Munmap(a, BLOCK)).expect("munmap");
        }
        signals
    }
}

/// The value CPU `id` stores in round `round` at page `p`, offset `k`.
fn pattern(id: u64, round: u64, p: u64, k: u64) -> u64 {
    (id << 48) ^ (round << 24) ^ (p << 8) ^ k
}

/// The syscall thread: runs forwarded calls until every CPU is gone;
/// returns how many it ran.
fn serve(mm: Arc<AddressSpace>, rx: mpsc::Receiver<Request>) -> u64 {
    let mut calls = 0;
    for Request(call, reply) in rx {
        let r = match call {
            Syscall::Mmap(len, prot) => {
                mm.mmap(0, len, prot, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
            }
            Syscall::Mprotect(a, len, prot) => mm.mprotect(a, len, prot).map(|()| 0),
            Syscall::Munmap(a, len) => mm.munmap(a, len).map(|()| 0),
        };
        calls += 1;
        let _ = reply.send(r);
    }
    calls
}

/// Loads the program, shows its first instruction, plants a breakpoint
/// there with a forced write and fetches from the (NX) stack.
fn exec(mm: &Arc<AddressSpace>, program: &str) -> ExecImage {
    let args = ExecArgs::new(program, &[program], &["PATH=/usr/bin:/bin"]);
    let img = load_elf(mm, &args).expect("exec");
    println!(
        "exec {program}: {} VMAs, entry {:#x}, rsp {:#x}, brk {:#x}",
        mm.map_count(),
        img.entry,
        img.rsp,
        img.brk
    );
    let mut cpu = Translator::new_owned(Arc::clone(mm));
    let mut insn = [0u8; 8];
    cpu.fetch_insn(img.entry, &mut insn).unwrap();
    println!("  first bytes at the entry: {insn:02x?}");
    let before = mm.map_count();
    mm.write_forced(img.entry, &[0xcc]).unwrap(); // int3, as ptrace POKETEXT
    cpu.fetch_insn(img.entry, &mut insn[..1]).unwrap();
    assert_eq!(insn[0], 0xcc);
    assert_eq!(mm.map_count(), before, "a forced write splits no VMA");
    println!("  breakpoint planted by a forced write: {before} VMAs still");
    let si = SigInfo::from(cpu.fetch::<u8>(img.rsp).unwrap_err());
    assert_eq!((si.signo, si.code), (11, 2));
    println!(
        "  fetch from the stack: signal {} si_code {} si_addr {:#x} (SIGSEGV/SEGV_ACCERR: NX)",
        si.signo, si.code, si.addr
    );
    img
}

/// ns per aligned load and store by width through `t`, against a plain
/// `Vec<u64>` of the same size (best of 5).
fn widths(mm: &Arc<AddressSpace>, loads: u64) {
    let rw = Prot::READ | Prot::WRITE;
    let flags = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
    mm.mmap(BASE, WORDS * 8, rw, flags).unwrap();
    let mut t = Translator::new_owned(Arc::clone(mm));
    let best = |f: &mut dyn FnMut()| {
        (0..5)
            .map(|_| {
                let s = Instant::now();
                f();
                s.elapsed().as_secs_f64() * 1e9 / loads as f64
            })
            .fold(f64::INFINITY, f64::min)
    };
    stores_of::<u64>(&mut t, WORDS);
    let mut v = slice();
    let vec_load = best(&mut || {
        plain(&v, loads);
    });
    let vec_store = best(&mut || plain_stores(&mut v, loads));
    println!("aligned guest accesses, ns each (x: against the plain Vec<u64> loop)");
    println!(
        "{:<16} {:>8} {:>7} {:>8} {:>7}",
        "", "load", "x", "store", "x"
    );
    println!(
        "{:<16} {vec_load:>8.2} {:>7} {vec_store:>8.2} {:>7}",
        "plain Vec<u64>", "", ""
    );
    let row = |w: &str, l: f64, s: f64| {
        println!(
            "{:<16} {l:>8.2} {:>6.2}x {s:>8.2} {:>6.2}x",
            format!("guest {w}"),
            l / vec_load,
            s / vec_store
        )
    };
    macro_rules! width {
        ($t:ty) => {{
            let l = best(&mut || {
                loads_of::<$t>(&mut t, loads);
            });
            let s = best(&mut || stores_of::<$t>(&mut t, loads));
            row(stringify!($t), l, s);
        }};
    }
    width!(u8);
    width!(u16);
    width!(u32);
    width!(u64);
    let mut p = vec![0u32; 2 * WORDS as usize];
    let vec_pair = best(&mut || plain_pairs(&mut p, loads));
    let guest_pair = best(&mut || pairs(&mut t, loads));
    let block_pair = best(&mut || block_pairs(&mut t, loads));
    println!(
        "u32 load+store pair: guest {guest_pair:.2} ns, plain Vec<u32> {vec_pair:.2} ns: {:.2}x (target <= 4x)",
        guest_pair / vec_pair
    );
    println!(
        "u32 load+store pair in blocks of {BLOCK_PAIRS}: guest {block_pair:.2} ns: {:.2}x the plain Vec",
        block_pair / vec_pair
    );
    mm.munmap(BASE, WORDS * 8).unwrap();
}

fn main() {
    let mut threads = 2u64;
    let mut rounds = 2000u64;
    let mut loads = 20_000_000u64;
    let mut program = String::from("/bin/true");
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let v = args.next().unwrap_or_default();
        match a.as_str() {
            "--threads" => threads = parse_arg(&v, |&n: &u64| n > 0).expect("--threads N"),
            "--rounds" => rounds = parse_arg(&v, |&n: &u64| n > 0).expect("--rounds R"),
            "--loads" => loads = parse_arg(&v, |&n: &u64| n > 0).expect("--loads N"),
            "--program" => program = v,
            _ => {
                eprintln!(
                    "usage: emulator [--threads N] [--rounds R] [--loads N] [--program PATH]"
                );
                std::process::exit(2);
            }
        }
    }
    println!("emulator: {}", machine());
    let mm = Arc::new(AddressSpace::new(Config::default()));
    let start = mm.stats();
    exec(&mm, &program);

    // The counter page every guest CPU adds to.
    let rw = Prot::READ | Prot::WRITE;
    let counter = mm
        .mmap(0, PAGE, rw, MapFlags::PRIVATE | MapFlags::ANONYMOUS)
        .unwrap();
    let (tx, rx) = mpsc::channel();
    let sys = {
        let mm = Arc::clone(&mm);
        std::thread::spawn(move || serve(mm, rx))
    };
    let before = mm.stats();
    let t0 = Instant::now();
    let cpus: Vec<_> = (0..threads)
        .map(|id| {
            let mut cpu = Cpu::new(id, &mm, tx.clone());
            std::thread::spawn(move || cpu.run(rounds, counter))
        })
        .collect();
    drop(tx);
    let signals: u64 = cpus.into_iter().map(|c| c.join().unwrap()).sum();
    let calls = sys.join().unwrap();
    let secs = t0.elapsed().as_secs_f64();
    let run: Stats = mm.stats() - before;
    let mut main_cpu = Translator::new_owned(Arc::clone(&mm));
    let total = main_cpu.load::<u32>(counter + 2).unwrap();
    assert_eq!(u64::from(total), threads * rounds, "misaligned lock xadd");
    println!(
        "guest threads: {threads} CPUs x {rounds} rounds in {secs:.2} s: {signals} SIGSEGVs delivered, counter {total}"
    );
    println!(
        "  faults {:.2} M/s ({} faults, {:.1}% speculative), forwarded mm calls {:.0} k/s",
        run.faults() as f64 / secs / 1e6,
        run.faults(),
        100.0 * run.fault_speculative as f64 / run.faults().max(1) as f64,
        calls as f64 / secs / 1e3
    );

    // fork, a copy-on-write store in the child, then exec in the child.
    let child = Arc::new(mm.fork().expect("fork"));
    let mut child_cpu = Translator::new_owned(Arc::clone(&child));
    child_cpu.store::<u32>(counter + 2, 0).unwrap();
    assert_eq!(main_cpu.load::<u32>(counter + 2).unwrap(), total);
    drop(child_cpu);
    child.exec_reset();
    let img = load_elf(&child, &ExecArgs::new(&program, &[&program], &[])).expect("exec");
    println!(
        "fork + exec in the child: child {} VMAs (entry {:#x}), parent {} VMAs, counter still {total}",
        child.map_count(),
        img.entry,
        mm.map_count()
    );
    drop(main_cpu);

    let all = mm.stats() - start;
    println!(
        "whole run (parent): {} faults, {:.1}% speculative",
        all.faults(),
        100.0 * all.fault_speculative as f64 / all.faults().max(1) as f64
    );
    println!();
    widths(&mm, loads);
}
