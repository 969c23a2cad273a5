//! A design of one's own under the workloads (README: "Running the
//! workloads against your own design"): a toy address space, one
//! `RwLock<BTreeMap>` of regions holding their words, implements
//! `aspace::workloads::Space` and runs the instantiation workload
//! (checked) and pft.

use aspace::workloads::instantiate::{self, Kind, Params, Until};
use aspace::workloads::{pft, Cpu, Space};
use aspace::{Advice, MapFlags, Prot, PAGE_SIZE};
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::RwLock;

/// One mapping: where it ends, its read-write ranges, its stored words.
struct Region {
    end: u64,
    rw: Vec<(u64, u64)>,
    words: HashMap<u64, u64>,
}

/// The toy: regions by start, placed by a bump pointer with a page gap.
struct Toy {
    maps: RwLock<BTreeMap<u64, Region>>,
    next: AtomicU64,
}

fn errno(e: i32) -> io::Error {
    io::Error::from_raw_os_error(e)
}

impl Toy {
    fn new() -> Toy {
        Toy {
            maps: RwLock::new(BTreeMap::new()),
            next: AtomicU64::new(1 << 32),
        }
    }

    /// Runs `f` on the region holding `addr..addr + len`, or fails.
    fn with<T>(
        &self,
        addr: u64,
        len: u64,
        f: impl FnOnce(&mut Region) -> io::Result<T>,
    ) -> io::Result<T> {
        let mut maps = self.maps.write().expect("toy lock");
        let (_, r) = maps
            .range_mut(..=addr)
            .next_back()
            .filter(|(_, r)| addr.checked_add(len).is_some_and(|e| e <= r.end))
            .ok_or_else(|| errno(libc::ENOMEM))?;
        f(r)
    }

    fn writable(r: &Region, addr: u64) -> io::Result<()> {
        match r.rw.iter().any(|&(s, e)| (s..e).contains(&addr)) {
            true => Ok(()),
            false => Err(errno(libc::EFAULT)),
        }
    }
}

impl Space for Toy {
    type Cpu<'a> = &'a Toy;

    fn mmap(&self, len: u64, prot: Prot, _flags: MapFlags) -> io::Result<u64> {
        if len == 0 || len % PAGE_SIZE != 0 {
            return Err(errno(libc::EINVAL));
        }
        let start = self.next.fetch_add(len + PAGE_SIZE, Ordering::Relaxed);
        let r = Region {
            end: start + len,
            rw: match prot.contains(Prot::READ | Prot::WRITE) {
                true => vec![(start, start + len)],
                false => Vec::new(),
            },
            words: HashMap::new(),
        };
        self.maps.write().expect("toy lock").insert(start, r);
        Ok(start)
    }

    fn mprotect(&self, addr: u64, len: u64, prot: Prot) -> io::Result<()> {
        self.with(addr, len, |r| {
            r.rw.retain(|&(s, e)| e <= addr || s >= addr + len);
            if prot.contains(Prot::READ | Prot::WRITE) {
                r.rw.push((addr, addr + len));
            }
            Ok(())
        })
    }

    fn munmap(&self, addr: u64, len: u64) -> io::Result<()> {
        // Whole regions only: the toy cannot split one.
        let mut maps = self.maps.write().expect("toy lock");
        match maps.get(&addr) {
            Some(r) if r.end == addr + len => {
                maps.remove(&addr);
                Ok(())
            }
            _ => Err(errno(libc::EINVAL)),
        }
    }

    fn madvise(&self, addr: u64, len: u64, advice: Advice) -> io::Result<()> {
        self.with(addr, len, |r| {
            // No huge pages here: only DONTNEED does something.
            if advice == Advice::DontNeed {
                r.words.retain(|a, _| !(addr..addr + len).contains(a));
            }
            Ok(())
        })
    }

    fn cpu(&self) -> &Toy {
        self
    }
}

impl Cpu for &Toy {
    unsafe fn store(&mut self, addr: u64, v: u64) -> io::Result<()> {
        self.with(addr, 8, |r| {
            Toy::writable(r, addr)?;
            r.words.insert(addr, v);
            Ok(())
        })
    }

    unsafe fn load(&mut self, addr: u64) -> io::Result<u64> {
        self.with(addr, 8, |r| {
            Toy::writable(r, addr)?;
            Ok(r.words.get(&addr).copied().unwrap_or(0))
        })
    }
}

#[test]
fn the_toy_runs_the_instantiation_workload() {
    let toy = Toy::new();
    for kind in [Kind::Instances, Kind::WritersOnly] {
        let p = Params {
            threads: 2,
            kind,
            until: Until::Instances(8),
            check: true,
            pin: false,
        };
        let s = instantiate::run(&toy, &p).expect("toy instances");
        assert_eq!(s.instances, 16);
        assert!(toy.maps.read().expect("toy lock").is_empty());
    }
}

#[test]
fn the_toy_runs_pft() {
    let toy = Toy::new();
    for layout in [
        pft::Layout::Single,
        pft::Layout::PerThread,
        pft::Layout::Interleaved,
    ] {
        let p = pft::Params {
            threads: 2,
            layout,
            bytes_per_thread: 64 * PAGE_SIZE,
            huge: false,
            pin: false,
        };
        let s = pft::run(&toy, &p).expect("toy pft");
        assert_eq!(s.faults, 128, "{layout:?}");
        assert!(toy.maps.read().expect("toy lock").is_empty());
    }
}
