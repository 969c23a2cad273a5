//! The running kernel as a [`Space`]: libc's mmap, mprotect, munmap and
//! madvise on this process, and plain stores, so a driver's program runs
//! unchanged on Linux beside aspace's modes.

use super::{Cpu, Space};
use crate::{Advice, MapFlags, Prot};
use std::io;

/// This process's own address space, through libc. Its calls trust their
/// arguments as the syscalls do, so making one is `unsafe`
/// ([`Kernel::new`]).
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    _trusted: (),
}

impl Kernel {
    /// The running kernel's space.
    ///
    /// # Safety
    ///
    /// Every `mprotect`, `munmap` and `madvise` made through it
    /// names only memory that its own `mmap` returned, which no Rust
    /// reference points into (the drivers of this module do so).
    pub unsafe fn new() -> Kernel {
        Kernel { _trusted: () }
    }
}

/// A thread's plain loads and stores (the MMU and the kernel's fault
/// handler do the rest).
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelCpu;

/// `Ok` when a libc call returned 0, else the errno it set.
fn check(rc: libc::c_int) -> io::Result<()> {
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// `len` as a `size_t`, or `EINVAL`.
fn size(len: u64) -> io::Result<usize> {
    usize::try_from(len).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))
}

impl Space for Kernel {
    type Cpu<'a> = KernelCpu;

    fn mmap(&self, len: u64, prot: Prot, flags: MapFlags) -> io::Result<u64> {
        // Anonymous only: no file, and no hint (nothing of ours is
        // replaced; MAP_FIXED would be, so it is refused).
        if flags.intersects(MapFlags::FIXED) || !flags.contains(MapFlags::ANONYMOUS) {
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        }
        // SAFETY: a new anonymous mapping where the kernel chooses: it
        // overlaps nothing this process uses.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                size(len)?,
                prot.bits() as libc::c_int,
                flags.bits() as libc::c_int,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(p as u64)
    }

    fn mprotect(&self, addr: u64, len: u64, prot: Prot) -> io::Result<()> {
        // SAFETY: only memory this `Kernel` mapped, unreferenced
        // (`Kernel::new`'s contract).
        check(unsafe { libc::mprotect(addr as *mut _, size(len)?, prot.bits() as libc::c_int) })
    }

    fn munmap(&self, addr: u64, len: u64) -> io::Result<()> {
        // SAFETY: as for `mprotect` (`Kernel::new`'s contract).
        check(unsafe { libc::munmap(addr as *mut _, size(len)?) })
    }

    fn madvise(&self, addr: u64, len: u64, advice: Advice) -> io::Result<()> {
        // SAFETY: as for `mprotect` (`Kernel::new`'s contract): advice on
        // anonymous memory of ours (DONTNEED's pages then read zero).
        check(unsafe { libc::madvise(addr as *mut _, size(len)?, advice.to_raw()) })
    }

    fn cpu(&self) -> KernelCpu {
        KernelCpu
    }
}

impl Cpu for KernelCpu {
    unsafe fn store(&mut self, addr: u64, v: u64) -> io::Result<()> {
        // SAFETY: the caller keeps `addr..addr + 8` mapped read-write
        // (`Cpu::store`'s contract); no Rust reference points into it.
        unsafe { (addr as *mut u64).write_volatile(v) };
        Ok(())
    }

    unsafe fn load(&mut self, addr: u64) -> io::Result<u64> {
        // SAFETY: as for `store`.
        Ok(unsafe { (addr as *const u64).read_volatile() })
    }
}
