//! Host memory stays within the budget whatever the guest does: a storm of
//! page-table-hungry calls (one touched page per 2 MiB, per 1 GiB and per
//! 512 GiB: PTE, PMD and PUD tables), mprotect and munmap churn, fork,
//! shared sparse objects, and freeing then reallocating everything as data
//! frames or heap metadata, against a space with a 1 GiB budget. The
//! process's peak RSS (`VmHWM`, reset through `/proc/self/clear_refs`
//! before each storm) may pass its baseline by at most the budget plus a
//! quarter plus 64 MiB.
//!
//! Each storm runs in a process of its own, so nothing else allocates
//! there meanwhile.

use aspace::{Access, AddressSpace, Config, Error, FaultError, MapFlags, Memfd, Prot, PAGE_SIZE};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const BUDGET: u64 = GIB;
const RW: Prot = Prot::READ.union(Prot::WRITE);
const ANON: MapFlags = MapFlags::PRIVATE
    .union(MapFlags::ANONYMOUS)
    .union(MapFlags::NORESERVE);
const SHARED: MapFlags = MapFlags::SHARED
    .union(MapFlags::ANONYMOUS)
    .union(MapFlags::NORESERVE);
/// A sparse mapping's length: 64 TiB, half of the 128 TiB user space.
const SPARSE: u64 = 64 << 40;
/// The length of each of four sparse mappings that live at once.
const QUARTER: u64 = 24 << 40;

/// `field` of /proc/self/status, in bytes.
fn status_bytes(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("status");
    let line = s
        .lines()
        .find(|l| l.starts_with(field))
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"));
    let kib: u64 = line[field.len()..]
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .expect("a number of kB");
    kib * 1024
}

/// Resets the peak RSS to the current RSS (Linux 4.0's `clear_refs` 5).
fn reset_peak() {
    std::fs::write("/proc/self/clear_refs", "5").expect("clear_refs");
    let (rss, hwm) = (status_bytes("VmRSS:"), status_bytes("VmHWM:"));
    assert!(hwm <= rss + MIB, "peak reset: VmHWM {hwm} VmRSS {rss}");
}

/// Faults `access` at `base + i * stride` for `i` from 0 until the budget
/// refuses (or `len` is covered). Returns how many faults succeeded.
fn touch_until_full(mm: &AddressSpace, base: u64, len: u64, stride: u64, access: Access) -> u64 {
    let mut n = 0;
    let mut off = 0;
    while off < len {
        match mm.fault(base + off, access) {
            Ok(()) => n += 1,
            Err(FaultError::OutOfMemory) => break,
            Err(e) => panic!("fault at {:#x}: {e:?}", base + off),
        }
        off += stride;
    }
    n
}

/// Fills the budget with page tables: reads (zero page, no data frame) of
/// one page per `stride` of a huge mapping. Returns the mapping.
fn sparse_tables(mm: &AddressSpace, len: u64, stride: u64, access: Access) -> u64 {
    let a = mm.mmap(0, len, RW, ANON).unwrap();
    touch_until_full(mm, a, len, stride, access);
    a
}

/// Splits a sparse mapping into many VMAs (mprotect every other 2 MiB,
/// then half of them back), then unmaps pieces of it.
fn mprotect_churn(mm: &AddressSpace, a: u64) {
    for i in 0..4096u64 {
        let at = a + 2 * i * (2 * MIB);
        let _ = mm.mprotect(at, 2 * MIB, Prot::READ);
    }
    for i in (0..4096u64).step_by(2) {
        let at = a + 2 * i * (2 * MIB);
        let _ = mm.mprotect(at, 2 * MIB, RW);
    }
    for i in (0..4096u64).step_by(3) {
        let _ = mm.munmap(a + i * (2 * MIB), 2 * MIB);
    }
}

/// Fills the budget with a shared object's tree nodes (heap metadata):
/// one byte every 4 TiB of an object of the largest size makes five new
/// nodes (2.5 KiB) per 4 KiB frame, and no page table.
fn object_nodes(mm: &AddressSpace) {
    let m = Memfd::new_in(mm.frame_pool(), "nodes", aspace::memfd::MAX_LEN).unwrap();
    let mut off = 0u64;
    loop {
        match m.write_at(b"x", off) {
            Ok(1) => {}
            Err(Error::NoMem) => break,
            r => panic!("write at {off:#x}: {r:?}"),
        }
        off = match off.checked_add(4 << 40) {
            Some(o) if o < aspace::memfd::MAX_LEN => o,
            _ => break,
        };
    }
}

/// Writes every page of a fresh mapping until the budget refuses: the
/// frames the tables gave back, and more, become data frames.
fn dense_data(mm: &AddressSpace) -> u64 {
    let a = mm.mmap(0, 2 * BUDGET, RW, ANON).unwrap();
    let mut off = 0;
    while off < 2 * BUDGET {
        match mm.write(a + off, &[0x5a; 64]) {
            Ok(()) => {}
            Err(e) if e.errno() == Error::NoMem.errno() => break,
            Err(e) => panic!("write at {:#x}: {e:?}", a + off),
        }
        off += PAGE_SIZE;
    }
    a
}

/// Set in the child process a test runs its storm in.
const CHILD: &str = "ASPACE_HOST_RSS_CHILD";

/// Runs `storm` in a fresh process (this binary, running only the test
/// `name`), so that its peak RSS counts nothing of another test's, nor
/// the heap a storm before it left behind.
fn in_child(name: &str, storm: fn()) {
    if std::env::var_os(CHILD).is_some() {
        storm();
        return;
    }
    let exe = std::env::current_exe().expect("the test binary");
    let out = std::process::Command::new(exe)
        .args([name, "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD, "1")
        .output()
        .expect("run the storm");
    eprintln!("{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "the storm failed:\n{stdout}");
    assert!(
        stdout.contains("1 passed"),
        "the storm did not run:\n{stdout}"
    );
}

/// The peak RSS past a baseline, noted after each phase of a storm.
struct Peaks {
    base: u64,
    notes: Vec<String>,
}

impl Peaks {
    /// Resets the peak and takes the current RSS as the baseline.
    fn start() -> Peaks {
        reset_peak();
        Peaks {
            base: status_bytes("VmRSS:"),
            notes: Vec::new(),
        }
    }

    fn peak(&self) -> u64 {
        status_bytes("VmHWM:").saturating_sub(self.base)
    }

    fn note(&mut self, what: &str, mm: &AddressSpace) {
        let rss = status_bytes("VmRSS:").saturating_sub(self.base);
        self.notes.push(format!(
            "{what}: peak {} MiB, now {} MiB, charged {} MiB",
            self.peak() / MIB,
            rss / MIB,
            mm.memory_used() / MIB
        ));
    }

    /// Asserts the peak is within `budget * 1.25 + 64 MiB`.
    fn check(&self, budget: u64) {
        let limit = budget + budget / 4 + 64 * MIB;
        let table = self.notes.join("\n");
        eprintln!("{table}");
        assert!(
            self.peak() <= limit,
            "host RSS grew {} MiB past its baseline against a {} MiB budget \
             (limit {} MiB):\n{table}",
            self.peak() / MIB,
            budget / MIB,
            limit / MIB,
        );
    }
}

fn space() -> AddressSpace {
    AddressSpace::new(Config {
        memory_budget: BUDGET,
        ..Config::default()
    })
}

/// Page tables, fork, mprotect churn and data frames, each filling the
/// budget in turn and handing its memory to the next.
#[test]
fn tables_and_data_in_turn_stay_within_the_budget() {
    in_child(
        "tables_and_data_in_turn_stay_within_the_budget",
        tables_and_data,
    );
}

fn tables_and_data() {
    let mm = space();
    let mut peaks = Peaks::start();
    // PTE tables: one read per 2 MiB maps the zero page, so the budget
    // fills with tables alone.
    let a = sparse_tables(&mm, SPARSE, 2 * MIB, Access::Read);
    peaks.note("pte tables", &mm);
    // A fork copies them (until the budget refuses).
    drop(mm.fork());
    peaks.note("fork", &mm);
    mprotect_churn(&mm, a);
    peaks.note("mprotect churn", &mm);
    mm.munmap(a, SPARSE).unwrap();
    // The freed tables' memory becomes data frames.
    let d = dense_data(&mm);
    peaks.note("data after tables", &mm);
    mm.munmap(d, 2 * BUDGET).unwrap();
    // And the freed data frames' memory becomes tables again: PMD
    // tables (one write per 1 GiB) and PUD tables (one per 512 GiB),
    // then PTE tables behind write faults.
    let p = sparse_tables(&mm, QUARTER, GIB, Access::Write);
    let q = sparse_tables(&mm, QUARTER, 512 * GIB, Access::Write);
    let r = sparse_tables(&mm, QUARTER, 2 * MIB + PAGE_SIZE, Access::Write);
    peaks.note("pmd, pud and pte tables after data", &mm);
    // A shared sparse object: frames, the object's nodes and tables.
    let s = mm.mmap(0, QUARTER, RW, SHARED).unwrap();
    touch_until_full(&mm, s, QUARTER, 2 * MIB + 7 * PAGE_SIZE, Access::Write);
    peaks.note("shared sparse", &mm);
    for x in [p, q, r, s] {
        mm.munmap(x, QUARTER).unwrap();
    }
    let d = dense_data(&mm);
    peaks.note("data again", &mm);
    mm.munmap(d, 2 * BUDGET).unwrap();
    peaks.check(BUDGET);
}

/// Data frames fill the budget and are freed; then a shared object's tree
/// nodes, heap metadata, take the budget in their place. The freed frames
/// the pool caches must not stay resident beside them.
#[test]
fn cached_free_frames_do_not_add_to_heap_metadata() {
    in_child(
        "cached_free_frames_do_not_add_to_heap_metadata",
        data_then_nodes,
    );
}

fn data_then_nodes() {
    let mm = space();
    let mut peaks = Peaks::start();
    let d = dense_data(&mm);
    peaks.note("data", &mm);
    mm.munmap(d, 2 * BUDGET).unwrap();
    peaks.note("data freed", &mm);
    object_nodes(&mm);
    peaks.note("object nodes after data", &mm);
    peaks.check(BUDGET);
}

/// A shared object's tree nodes fill the budget and the object is dropped
/// (its nodes go back to the heap); then data frames take the budget in
/// their place. The freed nodes must not stay resident beside them.
#[test]
fn freed_object_nodes_do_not_add_to_data() {
    in_child("freed_object_nodes_do_not_add_to_data", nodes_then_data);
}

fn nodes_then_data() {
    let mm = space();
    let mut peaks = Peaks::start();
    object_nodes(&mm);
    peaks.note("object nodes", &mm);
    let d = dense_data(&mm);
    peaks.note("data after the nodes were freed", &mm);
    mm.munmap(d, 2 * BUDGET).unwrap();
    peaks.check(BUDGET);
}
