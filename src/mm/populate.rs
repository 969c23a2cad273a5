//! Populating ranges: `MAP_POPULATE`, `MADV_POPULATE_READ`/`WRITE`, and
//! the populate after mlock, `mlockall`, mprotect of locked memory, an
//! mremap or brk grow of it (Linux's `__mm_populate` and
//! `madvise_populate`).
//!
//! One loop serves them all: judge the VMA at the cursor, fault its pages
//! in, step over a huge page whole ([`populated_past`]), and judge the
//! cursor again where a fault is refused for the access or the mapping.
//! No lock is held between faults, so the VMA judged is only a snapshot:
//! such a refusal means a writer changed it since (an mprotect to
//! read-only fails the write faults chosen before it, an munmap any).
//! Linux populates each VMA as it finds it under the mmap_lock and looks
//! it up again after a fault that dropped the lock, so every page still
//! accessible ends resident; a writer that keeps changing the VMA keeps
//! the loop going, as the mmap_lock would keep it waiting in Linux. A VMA
//! is faulted only with an access its snapshot allows, so the loop cannot
//! judge again without a writer having changed something.
//!
//! The callers differ only in their [`Policy`]: which VMAs they fault,
//! with which access, and what a hole or a failed fault means.
//!
//! [`populated_past`]: AddressSpace::populated_past

use super::{Access, AddressSpace};
use crate::addr::{Range, PAGE_SIZE};
use crate::error::{Error, FaultError, Result};
use crate::vma::VmFlags;

/// What a populate does with a VMA, or after a fault that failed.
enum Next {
    /// Fault the VMA's pages in with this access.
    Fault(Access),
    /// Go on at the next VMA.
    Skip,
    /// End the populate with this result.
    Stop(Result<()>),
}

/// How one kind of populate judges VMAs and failures.
trait Policy {
    /// What no VMA at the cursor means: `None` goes on at the next VMA.
    fn hole(&self) -> Option<Error> {
        None
    }

    /// What to do with a VMA of flags `f`. An access it returns must be
    /// one `f` allows ([`Access::allowed_by`]).
    fn judge(&self, f: VmFlags) -> Next;

    /// What to do after a fault failed with `e` (not refused for the
    /// access or the mapping: those judge the cursor again).
    fn failed(&self, e: FaultError) -> Next;
}

/// `MAP_POPULATE` (and mprotect's populate of locked memory made
/// writable): best effort, as `__mm_populate` with its errors ignored.
/// Inaccessible VMAs and those locked on fault are skipped, a fault that
/// fails goes on at the next VMA (`SIGBUS` past a shared object's end:
/// the rest of that VMA is past it too), and running out of memory
/// (frames or page tables past the budget) ends it.
struct MapPopulate;

impl Policy for MapPopulate {
    fn judge(&self, f: VmFlags) -> Next {
        populate_access(f).map_or(Next::Skip, Next::Fault)
    }

    fn failed(&self, e: FaultError) -> Next {
        match e {
            FaultError::OutOfMemory => Next::Stop(Ok(())),
            _ => Next::Skip,
        }
    }
}

/// `MADV_POPULATE_READ` (`write` false) or `_WRITE`: stops at the first
/// hole (`ENOMEM`), at a VMA that does not allow the access itself
/// (`EINVAL`: GUP's `check_vma_flags`, so a write-only or exec-only VMA is
/// not populated for reading though x86 lets a user-mode load read it), or
/// at a fault that fails (`ENOMEM` out of memory, else `EFAULT`).
struct MadvisePopulate {
    /// `MADV_POPULATE_WRITE`.
    write: bool,
}

impl Policy for MadvisePopulate {
    fn hole(&self) -> Option<Error> {
        Some(Error::NoMem)
    }

    fn judge(&self, f: VmFlags) -> Next {
        let (access, needs) = if self.write {
            (Access::Write, VmFlags::WRITE)
        } else {
            (Access::Read, VmFlags::READ)
        };
        if f.contains(needs) && access.allowed_by(f) {
            Next::Fault(access)
        } else {
            Next::Stop(Err(Error::Inval))
        }
    }

    fn failed(&self, e: FaultError) -> Next {
        Next::Stop(Err(match e {
            FaultError::OutOfMemory => Error::NoMem,
            _ => Error::Fault,
        }))
    }
}

/// The populate after a lock (`__mm_populate`): the locked (or droppable)
/// VMAs that do not lock on fault, for writing where private and
/// writable. A failure ends it with mlock's errors (`ENOMEM` for an
/// inaccessible VMA or a fault that cannot be resolved, `EAGAIN` out of
/// memory), or with `ignore_errors` goes on at the next VMA.
struct LockedPopulate {
    /// Go on at the next VMA after a failure (mlockall, mremap, brk).
    ignore_errors: bool,
}

impl LockedPopulate {
    fn fail(&self, e: Error) -> Next {
        if self.ignore_errors {
            Next::Skip
        } else {
            Next::Stop(Err(e))
        }
    }
}

impl Policy for LockedPopulate {
    fn judge(&self, f: VmFlags) -> Next {
        // Every VMA of the range is locked by now but droppable ones,
        // which are populated all the same (`__mm_populate` walks the
        // range); on-fault locks are not.
        let wanted = f.contains(VmFlags::LOCKED) || f.contains(VmFlags::DROPPABLE);
        if !wanted || f.contains(VmFlags::LOCKONFAULT) {
            return Next::Skip;
        }
        match populate_access(f) {
            Some(access) => Next::Fault(access),
            None => self.fail(Error::NoMem),
        }
    }

    fn failed(&self, e: FaultError) -> Next {
        self.fail(match e {
            FaultError::OutOfMemory => Error::Again,
            _ => Error::NoMem,
        })
    }
}

impl AddressSpace {
    /// Populates `r` as `policy` says (module docs). `given`, if any, are
    /// the flags the caller just gave all of `r` under a lock it has
    /// released since: judged first in place of a lookup (a populate no
    /// writer meets then reads no lock: the VMAs are looked up only after
    /// a refused fault).
    fn populate_with(
        &self,
        r: Range,
        mut given: Option<VmFlags>,
        policy: &impl Policy,
    ) -> Result<()> {
        let mut a = r.start;
        'vmas: while a < r.end {
            let (stop, f) = match given.take() {
                Some(f) => (r.end, f),
                None => match self.vma_after(a).filter(|v| v.start < r.end) {
                    Some(v) if v.start <= a || policy.hole().is_none() => {
                        a = a.max(v.start);
                        (v.end.min(r.end), v.flags)
                    }
                    _ => return policy.hole().map_or(Ok(()), Err),
                },
            };
            match policy.judge(f) {
                Next::Fault(access) => {
                    while a < stop {
                        match self.fault(a, access) {
                            Ok(()) => a = self.populated_past(a),
                            Err(FaultError::NoMapping | FaultError::AccessDenied) => continue 'vmas,
                            Err(e) => match policy.failed(e) {
                                Next::Stop(res) => return res,
                                _ => break,
                            },
                        }
                    }
                }
                Next::Skip => {}
                Next::Stop(res) => return res,
            }
            a = stop;
        }
        Ok(())
    }

    /// `MAP_POPULATE`'s populate of `r`, to which the caller just gave
    /// the flags `vf` ([`MapPopulate`]).
    pub(crate) fn populate(&self, r: Range, vf: VmFlags) {
        // Best effort: its policy never stops with an error.
        let _ = self.populate_with(r, Some(vf), &MapPopulate);
    }

    /// `MADV_POPULATE_READ` (`write` false) or `_WRITE` of `r`
    /// ([`MadvisePopulate`]).
    pub(super) fn madvise_populate(&self, r: Range, write: bool) -> Result<()> {
        self.populate_with(r, None, &MadvisePopulate { write })
    }

    /// The populate of `r` after a lock ([`LockedPopulate`]).
    pub(super) fn populate_locked(&self, r: Range, ignore_errors: bool) -> Result<()> {
        self.populate_with(r, None, &LockedPopulate { ignore_errors })
    }

    /// Where a populate goes on after faulting `a` in: past the huge page
    /// that maps it, if a 2 MiB-aligned `a` is now mapped by one (its 511
    /// other pages are in too: GUP steps over a huge page whole), else to
    /// the next page. Without it a populate of a large huge-zero-page
    /// range (no frame used, one table per GiB) faulted its 4 KiB steps
    /// one by one: 2^30 spurious faults before a 16 MiB budget ran out.
    /// One walk per 2 MiB.
    pub(crate) fn populated_past(&self, a: u64) -> u64 {
        if a % crate::pt::HUGE_SIZE == 0 && self.pt.huge_at(a, &self.pt.pin()).is_some() {
            a.saturating_add(crate::pt::HUGE_SIZE)
        } else {
            a.saturating_add(PAGE_SIZE)
        }
    }

    /// A snapshot of the first VMA ending above `addr`.
    fn vma_after(&self, addr: u64) -> Option<super::VmaInfo> {
        let st = self.mmap_lock.read();
        let g = self.tree.pin();
        self.tree
            .find_after(addr, &g)
            .map(|(_, v)| super::maps::snapshot(&st, &self.heap, v))
    }
}

/// The access a populate (`MAP_POPULATE`, mlock's) faults a VMA with
/// flags `f` in for: a write where private and writable (copy-on-write
/// broken at once), else a read; `None` where inaccessible (`PROT_NONE` is
/// not populated), locked on fault (`populate_vma_page_range` skips it:
/// a concurrent `mlock2` with `MLOCK_ONFAULT` may have made it so), or
/// where `f` does not allow that access (an execute-only VMA), as
/// [`Policy::judge`] requires.
fn populate_access(f: VmFlags) -> Option<Access> {
    if !f.accessible() || f.contains(VmFlags::LOCKONFAULT) {
        return None;
    }
    let access = if f.contains(VmFlags::WRITE) && !f.contains(VmFlags::SHARED) {
        Access::Write
    } else {
        Access::Read
    };
    access.allowed_by(f).then_some(access)
}
