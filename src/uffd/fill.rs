//! Resolving faults by filling pages: `UFFDIO_COPY`, `UFFDIO_ZEROPAGE` and
//! `UFFDIO_CONTINUE` (Linux's `mfill_atomic`).
//!
//! The destination must lie in one registered VMA. Pages are filled in
//! order, each installed only into an empty entry (`EEXIST` otherwise: of
//! two handlers racing for a page, exactly one wins and the other learns
//! it); the first failure stops the call, and the bytes filled before it
//! are reported as Linux does (`EAGAIN` with the count). The pages filled
//! are then woken unless the caller asks not to.
//!
//! # Locking
//!
//! The mmap_lock read side (the VMA stays put; any number of handlers
//! fill at once), then the PTE table's lock for each install, then the
//! wait queue's lock for the wake, after the installs. Order:
//! [`crate::mm`].

use super::{validate_range, Uffd};
use crate::addr::{Range, PAGE_SIZE};
use crate::error::Error;
use crate::mm::anon_vma::anon_vma_prepare;
use crate::mm::fault::InstallError;
use crate::mm::AddressSpace;
use crate::phys::Pfn;
use crate::pt::{Pte, PteFlags};
use crate::vma::{VmFlags, Vma};
use core::fmt;

/// A fill that failed (`copy`, `zeropage`, `continue_`): the bytes filled
/// before the failure and the error. As Linux reports it, a call that
/// filled some pages fails with `EAGAIN` (the cause of the stop is lost);
/// one that filled none fails with the cause (`EEXIST`, `ENOENT`,
/// `ENOMEM`, ...).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FillError {
    /// Bytes filled (and woken, unless asked not to) before the failure.
    pub copied: u64,
    /// `EAGAIN` if `copied > 0`, else the cause.
    pub error: Error,
}

impl FillError {
    fn none(error: Error) -> Self {
        FillError { copied: 0, error }
    }

    /// The errno of [`error`](Self::error).
    pub fn errno(&self) -> i32 {
        self.error.errno()
    }
}

impl fmt::Display for FillError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} after {} bytes", self.error, self.copied)
    }
}

impl std::error::Error for FillError {}

impl From<FillError> for Error {
    fn from(e: FillError) -> Self {
        e.error
    }
}

/// What goes into each page.
#[derive(Clone, Copy)]
enum Fill<'s> {
    Copy(&'s [u8]),
    Zero,
    Continue,
}

impl Uffd<'_> {
    /// Fills `[dst, dst + src.len())` with `src` (`UFFDIO_COPY`), then
    /// wakes the faults waiting there if `wake`. Returns the bytes copied
    /// (all of them).
    ///
    /// Errors ([`FillError`]): `EINVAL` for a bad range (`src.len()` not a
    /// whole number of pages, or zero); `ENOENT` if no single registered
    /// VMA covers the range; `EEXIST` at a page already present (or, in a
    /// shared object, already in the object); `ENOMEM` when the budget has
    /// no frame; `EFAULT` past a shared object's end.
    pub fn copy(&self, src: &[u8], dst: u64, wake: bool) -> Result<u64, FillError> {
        self.fill(dst, src.len() as u64, Fill::Copy(src), false, wake)
    }

    /// [`copy`](Self::copy) with `UFFDIO_COPY_MODE_WP`: the pages are
    /// installed write-protected. `EINVAL` unless the VMA is registered
    /// with `WRITE_PROTECT`.
    pub fn copy_wp(&self, src: &[u8], dst: u64, wake: bool) -> Result<u64, FillError> {
        self.fill(dst, src.len() as u64, Fill::Copy(src), true, wake)
    }

    /// Maps zeroes at `[dst, dst + len)` (`UFFDIO_ZEROPAGE`): the shared
    /// zero page in private memory, zeroed pages of the object in a
    /// shared mapping. Errors as [`copy`](Self::copy).
    pub fn zeropage(&self, dst: u64, len: u64, wake: bool) -> Result<u64, FillError> {
        self.fill(dst, len, Fill::Zero, false, wake)
    }

    /// Maps the shared object's existing pages at `[dst, dst + len)`
    /// (`UFFDIO_CONTINUE`, resolving minor faults); read-only in a private
    /// mapping, whose first write then copies as usual. Errors as
    /// [`copy`](Self::copy), plus `EINVAL` for a VMA with no shared object
    /// and `EFAULT` where the object has no page.
    pub fn continue_(&self, dst: u64, len: u64, wake: bool) -> Result<u64, FillError> {
        self.fill(dst, len, Fill::Continue, false, wake)
    }

    fn fill(
        &self,
        dst: u64,
        len: u64,
        what: Fill<'_>,
        wp: bool,
        wake: bool,
    ) -> Result<u64, FillError> {
        let mm = self.mm();
        let r = validate_range(mm, dst, len).map_err(FillError::none)?;
        let (done, err) = {
            let _st = mm.mmap_lock.read();
            let g = mm.tree.pin();
            let Some((_, &vma)) = mm.tree.find(dst, &g) else {
                return Err(FillError::none(Error::NoEnt));
            };
            // Linux prepares the anon_vma of a private VMA before it checks
            // the range and the registration (`find_vma_and_prepare_anon`),
            // so even a refused fill can keep the VMA from merging later.
            if !vma.flags().contains(VmFlags::SHARED) {
                anon_vma_prepare(mm, &vma, false).map_err(|_| FillError::none(Error::NoMem))?;
            }
            if vma.end() < r.end || vma.uffd_ptr().is_null() {
                return Err(FillError::none(Error::NoEnt));
            }
            if wp && !vma.flags().contains(VmFlags::UFFD_WP) {
                return Err(FillError::none(Error::Inval));
            }
            if matches!(what, Fill::Continue) && !vma.has_shmem() {
                return Err(FillError::none(Error::Inval));
            }
            let mut done = 0;
            let mut err = None;
            while done < len {
                let page = dst + done;
                let bytes = match what {
                    Fill::Copy(src) => Fill::Copy(&src[done as usize..(done + PAGE_SIZE) as usize]),
                    w => w,
                };
                if let Err(e) = fill_page(mm, &vma, page, bytes, wp) {
                    err = Some(e);
                    break;
                }
                done += PAGE_SIZE;
            }
            (done, err)
        };
        if done > 0 && wake {
            self.ctx().wake(Range::new(dst, dst + done));
        }
        match err {
            None => Ok(len),
            Some(e) if done == 0 => Err(FillError::none(e)),
            Some(_) => Err(FillError {
                copied: done,
                error: Error::Again,
            }),
        }
    }
}

/// Fills one page of `vma` (held through the mmap_lock read side).
fn fill_page(
    mm: &AddressSpace,
    vma: &Vma,
    page: u64,
    what: Fill<'_>,
    wp: bool,
) -> Result<(), Error> {
    let flags = vma.flags();
    // Written as a write fault leaves it (soft-dirty too, as Linux's
    // `pte_mkdirty` does).
    let mut pte_flags = PteFlags::from(flags) | crate::mm::soft_dirty::WRITTEN;
    if wp {
        pte_flags = (pte_flags - PteFlags::WRITE) | PteFlags::UFFD_WP;
    }
    // SAFETY: the caller holds the mmap_lock read side, so `vma` keeps
    // its object.
    let shm = unsafe { vma.shmem() };
    let pfn = match (shm, what) {
        (Some(shm), Fill::Continue) => {
            let idx = vma.pgoff_of(page);
            // A reference of our own, taken only while the object still
            // holds the page (a shrink may free it: `vma::mappings`).
            let pfn = shm.resident(idx).ok_or(Error::Fault)?;
            if !mm.frames.try_get(pfn) {
                return Err(Error::Fault);
            }
            if shm.resident(idx) != Some(pfn) {
                mm.frames.put(pfn);
                return Err(Error::Fault);
            }
            if !flags.contains(VmFlags::SHARED) {
                // A private mapping reads the object's page until it
                // writes (and copies) it.
                pte_flags -= PteFlags::WRITE;
            }
            pfn
        }
        (None, Fill::Continue) => return Err(Error::Inval),
        (Some(shm), w) if flags.contains(VmFlags::SHARED) => {
            // A shared mapping fills the object itself.
            let idx = vma.pgoff_of(page);
            if idx >= shm.npages() {
                return Err(Error::Fault);
            }
            let pfn = new_frame(mm, w)?;
            match shm.insert(idx, pfn) {
                Ok(()) => {}
                Err(existing) => {
                    mm.frames.put(pfn);
                    return Err(if existing.is_some() {
                        Error::Exist
                    } else {
                        Error::NoMem
                    });
                }
            }
            mm.frames.get(pfn); // the entry's reference
            pfn
        }
        (_, Fill::Zero) => {
            pte_flags -= PteFlags::WRITE | PteFlags::DIRTY | PteFlags::SOFT_DIRTY;
            Pfn::ZERO_PAGE
        }
        // The anon_vma was prepared before the first page.
        (_, w) => new_frame(mm, w)?,
    };
    let new = Pte::new(pfn, pte_flags);
    let g = mm.pt.pin();
    match crate::mm::fault::install(mm, vma, shm, page, new, &g) {
        Ok(()) => Ok(()),
        Err(InstallError::PastEnd) => Err(Error::Fault),
        Err(InstallError::NoTable) => Err(Error::NoMem),
        Err(InstallError::Taken) => Err(Error::Exist),
    }
}

/// A frame holding `what` (a page of bytes, or zeroes).
fn new_frame(mm: &AddressSpace, what: Fill<'_>) -> Result<Pfn, Error> {
    match what {
        Fill::Copy(bytes) => {
            let pfn = mm.frames.alloc_uninit().ok_or(Error::NoMem)?;
            mm.frames.write(pfn, 0, bytes);
            Ok(pfn)
        }
        _ => mm.frames.alloc().ok_or(Error::NoMem),
    }
}
