//! Separate spaces: every driver thread in an address space of its own,
//! the no-sharing ideal a shared space's thread scaling is read against.
//!
//! Issue 28 asks writers on disjoint ranges of one space to scale as if
//! they met nowhere. What "nowhere" gives on a given machine is not N
//! times one thread: two vCPUs of a VM, or two cores sharing a cache and
//! memory bandwidth, give less, and by a different amount from run to run.
//! [`Separate`] runs the same driver with each thread in its own
//! [`AddressSpace`] (the processes of a multi-process runtime, minus the
//! kernel): nothing of the space is shared, only the process (its
//! allocator, the frame pool's CPU caches, the epoch collector) and the
//! machine. Its rate at N threads over one shared space's is how much the
//! sharing costs, measured in the same run as the sharing itself.

use super::{Mode, Space};
use crate::{AddressSpace, Advice, MapFlags, Prot, Translator};
use std::cell::Cell;
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};

/// Distinguishes one [`Separate`] from another in a thread's record of
/// which space it was given (an address may be reused after a drop).
static NEXT_ID: AtomicUsize = AtomicUsize::new(1);

thread_local! {
    /// The calling thread's space: (the [`Separate`]'s id, its index).
    static MINE: Cell<(usize, usize)> = const { Cell::new((0, 0)) };
}

/// A [`Space`] whose every thread has an [`AddressSpace`] of its own.
///
/// A thread is given the next space when it makes its [`Cpu`](super::Cpu)
/// ([`Space::cpu`], which the drivers call once per thread, on it, before
/// the timed phase); its mmap, mprotect, munmap and madvise then go to
/// that space. A thread that calls without having made a `Cpu` uses the
/// first space. With more threads than spaces the spaces are handed out
/// again from the first, so some are shared.
///
/// ```
/// use aspace::workloads::instantiate::{self, Kind, Params, Until};
/// use aspace::workloads::{Separate, MODES};
///
/// let sep = Separate::new(&MODES[1], 2);
/// let p = Params { threads: 2, kind: Kind::Instances, until: Until::Instances(4), check: true, pin: false };
/// assert_eq!(instantiate::run(&sep, &p)?.instances, 8);
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Separate {
    spaces: Vec<AddressSpace>,
    id: usize,
    handed: AtomicUsize,
}

impl Separate {
    /// `count` fresh spaces (at least one) in `mode`.
    pub fn new(mode: &Mode, count: usize) -> Separate {
        Separate {
            spaces: (0..count.max(1)).map(|_| mode.space()).collect(),
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            handed: AtomicUsize::new(0),
        }
    }

    /// The spaces, in the order threads are given them.
    pub fn spaces(&self) -> &[AddressSpace] {
        &self.spaces
    }

    /// The calling thread's space.
    fn mine(&self) -> &AddressSpace {
        let (id, i) = MINE.get();
        &self.spaces[if id == self.id { i } else { 0 }]
    }
}

impl Space for Separate {
    type Cpu<'a> = Translator<'a>;

    fn mmap(&self, len: u64, prot: Prot, flags: MapFlags) -> io::Result<u64> {
        Space::mmap(self.mine(), len, prot, flags)
    }

    fn mprotect(&self, addr: u64, len: u64, prot: Prot) -> io::Result<()> {
        Space::mprotect(self.mine(), addr, len, prot)
    }

    fn munmap(&self, addr: u64, len: u64) -> io::Result<()> {
        Space::munmap(self.mine(), addr, len)
    }

    fn madvise(&self, addr: u64, len: u64, advice: Advice) -> io::Result<()> {
        Space::madvise(self.mine(), addr, len, advice)
    }

    fn cpu(&self) -> Translator<'_> {
        let i = self.handed.fetch_add(1, Ordering::Relaxed) % self.spaces.len();
        MINE.set((self.id, i));
        self.spaces[i].translator()
    }
}

#[cfg(all(test, not(aspace_loom)))]
mod tests {
    use super::*;
    use crate::workloads::MODES;

    #[test]
    fn each_thread_maps_in_its_own_space() {
        let sep = Separate::new(&MODES[0], 2);
        let rw = Prot::READ | Prot::WRITE;
        let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
        std::thread::scope(|s| {
            for _ in 0..2 {
                s.spawn(|| {
                    let _cpu = sep.cpu();
                    let a = Space::mmap(&sep, 2 << 20, rw, anon).unwrap();
                    Space::mprotect(&sep, a, 1 << 20, Prot::READ).unwrap();
                });
            }
        });
        for mm in sep.spaces() {
            assert_eq!(mm.map_count(), 2, "one mapping split in two, per space");
        }
        // A thread that made no Cpu of this Separate uses the first space.
        Space::mmap(&sep, 1 << 20, Prot::NONE, anon).unwrap();
        assert_eq!(sep.spaces()[0].map_count(), 3);
        assert_eq!(sep.spaces()[1].map_count(), 2);
    }

    #[test]
    fn spaces_are_handed_out_again_past_the_last() {
        let sep = Separate::new(&MODES[1], 2);
        let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS;
        std::thread::scope(|s| {
            for _ in 0..3 {
                s.spawn(|| {
                    let _cpu = sep.cpu();
                    Space::mmap(&sep, 1 << 20, Prot::NONE, anon).unwrap();
                });
            }
        });
        // The third thread's mapping lands beside the first's (a space's
        // placements touch and merge): count bytes, not VMAs.
        let bytes: Vec<u64> = sep
            .spaces()
            .iter()
            .map(|mm| mm.vmas().iter().map(|v| v.end - v.start).sum())
            .collect();
        assert_eq!(bytes, [2 << 20, 1 << 20]);
    }
}
