//! Errors, numbered like Linux's errno values.

use core::fmt;

/// An error from an address-space call, with the errno Linux returns for the
/// same call ([`Error::errno`]). Convert it into a [`std::io::Error`] with
/// `?` or `From` (the raw errno).
///
/// # Matching errors
///
/// Equality compares variants and their contents, so two errors with the
/// same errno can differ: a user-mode access that faults is
/// [`Error::Memory`] (with where and how much was done), while an
/// argument check that finds no mapping is [`Error::Fault`]; both are
/// `EFAULT`. To ask "which errno", compare errnos, or use
/// [`same_errno`](Error::same_errno):
///
/// ```
/// use aspace::{AddressSpace, Config, Error};
///
/// let mm = AddressSpace::new(Config::default());
/// let e = mm.write(0x10000, b"x").unwrap_err(); // nothing mapped there
/// assert!(matches!(e, Error::Memory(m) if m.addr == 0x10000 && m.done == 0));
/// assert_ne!(e, Error::Fault);                 // not the same variant,
/// assert!(e.same_errno(Error::Fault));         // but the same errno
/// assert_eq!(e.errno(), 14);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Error {
    /// `EPERM`: the operation is not permitted (e.g. below `mmap_min_addr`).
    Perm,
    /// `ENOENT`: no registered mapping covers the range (userfaultfd
    /// ioctls).
    NoEnt,
    /// `EAGAIN`: a resource is temporarily unavailable.
    Again,
    /// `ENOMEM`: no room, no memory, a hole in the range, or too many maps.
    NoMem,
    /// `EACCES`: the protection asked for is not allowed.
    AccessDenied,
    /// `EFAULT`: an address is not mapped or not accessible.
    Fault,
    /// A load or store by [`read`](crate::AddressSpace::read) or
    /// [`write`](crate::AddressSpace::write) faulted: where, why, and how
    /// many bytes were copied before. `EFAULT` (`ENOMEM` when the fault
    /// ran out of memory).
    Memory(MemoryFault),
    /// A page fault that could not be resolved, converted from
    /// [`FaultError`] (`EFAULT`, or `ENOMEM` for
    /// [`FaultError::OutOfMemory`]).
    PageFault(FaultError),
    /// `EBUSY`: the resource is busy.
    Busy,
    /// `EEXIST`: the range is already mapped (`MAP_FIXED_NOREPLACE`).
    Exist,
    /// `EINVAL`: an argument is invalid (alignment, length, flags).
    Inval,
    /// `EOVERFLOW`: an offset plus a length passes the largest object
    /// size ([`AddressSpace::mmap_fd`](crate::AddressSpace::mmap_fd)).
    Overflow,
    /// `EOPNOTSUPP`: a flag the object does not support
    /// (`MAP_SHARED_VALIDATE` with a flag outside Linux's legacy set).
    NotSupported,
    /// `EIO`: reading or writing back a host file failed (a file object,
    /// [`crate::file`]).
    Io,
    /// `EBADF`: the handle was not opened for this (a read of a
    /// write-only file object, a write of a read-only one).
    BadFd,
    /// `EXDEV`: the object's frames live in another physical memory than
    /// the address space's (both made on pools of their own,
    /// [`FrameAllocator::new`](crate::FrameAllocator::new)); objects and
    /// spaces made on the shared memory
    /// ([`FrameAllocator::shared`](crate::FrameAllocator::shared), the
    /// default) always map each other.
    CrossDevice,
}

impl Error {
    /// The Linux errno value of this error.
    pub const fn errno(self) -> i32 {
        match self {
            Error::Perm => 1,
            Error::NoEnt => 2,
            Error::Again => 11,
            Error::NoMem => 12,
            Error::AccessDenied => 13,
            Error::Fault => 14,
            Error::Memory(m) => m.kind.errno(),
            Error::PageFault(k) => k.errno(),
            Error::Busy => 16,
            Error::Exist => 17,
            Error::Inval => 22,
            Error::Overflow => 75,
            Error::NotSupported => 95,
            Error::Io => 5,
            Error::BadFd => 9,
            Error::CrossDevice => 18,
        }
    }

    /// Whether `self` and `other` carry the same errno, whatever else
    /// they say: `Error::Memory(..)` and `Error::PageFault(..)` of a
    /// mapping error are both [`Error::Fault`] by this test (see
    /// "Matching errors" above).
    pub const fn same_errno(self, other: Error) -> bool {
        self.errno() == other.errno()
    }

    /// The error with Linux errno value `errno`, if it is one of ours.
    pub const fn from_errno(errno: i32) -> Option<Error> {
        Some(match errno {
            1 => Error::Perm,
            2 => Error::NoEnt,
            11 => Error::Again,
            12 => Error::NoMem,
            13 => Error::AccessDenied,
            14 => Error::Fault,
            16 => Error::Busy,
            17 => Error::Exist,
            22 => Error::Inval,
            75 => Error::Overflow,
            95 => Error::NotSupported,
            5 => Error::Io,
            9 => Error::BadFd,
            18 => Error::CrossDevice,
            _ => return None,
        })
    }

    /// The symbolic name, e.g. `"EINVAL"`.
    pub const fn name(self) -> &'static str {
        match self {
            Error::Perm => "EPERM",
            Error::NoEnt => "ENOENT",
            Error::Again => "EAGAIN",
            Error::NoMem => "ENOMEM",
            Error::AccessDenied => "EACCES",
            Error::Fault => "EFAULT",
            Error::Memory(m) => m.kind.as_error().name(),
            Error::PageFault(k) => k.as_error().name(),
            Error::Busy => "EBUSY",
            Error::Exist => "EEXIST",
            Error::Inval => "EINVAL",
            Error::Overflow => "EOVERFLOW",
            Error::NotSupported => "EOPNOTSUPP",
            Error::Io => "EIO",
            Error::BadFd => "EBADF",
            Error::CrossDevice => "EXDEV",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.name(), self.errno())?;
        if let Error::Memory(m) = self {
            write!(f, ": {m}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Error::Memory(m) => Some(&m.kind),
            Error::PageFault(k) => Some(k),
            _ => None,
        }
    }
}

impl From<Error> for std::io::Error {
    /// The raw OS error with the same errno.
    fn from(e: Error) -> Self {
        std::io::Error::from_raw_os_error(e.errno())
    }
}

/// Where and why a [`read`](crate::AddressSpace::read) or
/// [`write`](crate::AddressSpace::write), or any access of a
/// [`Translator`](crate::Translator), stopped: what an emulator puts in
/// the `siginfo` it delivers ([`signal`](Self::signal),
/// [`si_code`](Self::si_code), `si_addr` = [`addr`](Self::addr)).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MemoryFault {
    /// The first address that could not be accessed.
    pub addr: u64,
    /// What a user-mode access there would get (`SEGV_MAPERR`,
    /// `SEGV_ACCERR`, `SIGBUS`, or out of memory).
    pub kind: FaultError,
    /// Bytes copied before it (the pages before `addr` were accessed, as
    /// by a real `memcpy` that faults part-way).
    pub done: usize,
}

impl MemoryFault {
    /// The signal a user-mode access would get ([`FaultError::signal`]).
    pub const fn signal(&self) -> Option<i32> {
        self.kind.signal()
    }

    /// The signal's `si_code` ([`FaultError::si_code`]).
    pub const fn si_code(&self) -> Option<i32> {
        self.kind.si_code()
    }
}

impl std::error::Error for MemoryFault {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.kind)
    }
}

impl From<MemoryFault> for FaultError {
    /// The fault's kind, for code that matches kinds only (a translator
    /// call's `?` in a function returning `Result<_, FaultError>`).
    fn from(m: MemoryFault) -> Self {
        m.kind
    }
}

impl From<MemoryFault> for Error {
    /// [`Error::Memory`].
    fn from(m: MemoryFault) -> Self {
        Error::Memory(m)
    }
}

impl fmt::Display for MemoryFault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} at {:#x} after {} bytes",
            self.kind, self.addr, self.done
        )
    }
}

/// Why a page fault could not be resolved: what Linux would deliver as a
/// signal to the faulting task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum FaultError {
    /// No VMA covers the address (`SIGSEGV`, `SEGV_MAPERR`).
    NoMapping,
    /// A VMA covers it but forbids this access (`SIGSEGV`, `SEGV_ACCERR`).
    AccessDenied,
    /// The mapping has no backing at this offset, e.g. the part of a shared
    /// mapping grown past its object with mremap (`SIGBUS`, `BUS_ADRERR`).
    Bus,
    /// A locked (atomic) operation whose operand splits a cache line or a
    /// page, refused as by Linux's `split_lock_detect=fatal` (`SIGBUS`,
    /// `BUS_ADRALN`): see [`SplitLock`](crate::SplitLock).
    Alignment,
    /// The memory budget has no room for a frame or a page-table page
    /// (`VM_FAULT_OOM`).
    OutOfMemory,
    /// A fault in a VMA registered for userfaults found no live handler
    /// context behind the registration (`SIGBUS`). The registration's
    /// invariants rule this out, so no fault reports it: a fault waiting
    /// when its range is unregistered or the last [`Uffd`](crate::Uffd)
    /// handle is dropped wakes and runs again as an ordinary fault, as in
    /// Linux, whose `handle_userfault` also retries (`VM_FAULT_NOPAGE`)
    /// for a released context rather than raise `SIGBUS`. The variant
    /// stays for code that matches it.
    HandlerGone,
}

impl FaultError {
    /// The errno that `read`/`write` report for this fault (`EFAULT`, or
    /// `ENOMEM` when out of memory).
    pub const fn as_error(self) -> Error {
        match self {
            FaultError::OutOfMemory => Error::NoMem,
            _ => Error::Fault,
        }
    }

    /// The errno of [`as_error`](Self::as_error).
    pub const fn errno(self) -> i32 {
        self.as_error().errno()
    }

    /// The signal a user-mode access would get: `SIGSEGV` (11) or
    /// `SIGBUS` (7); `None` for [`OutOfMemory`](Self::OutOfMemory), which
    /// Linux resolves with the OOM killer rather than a signal to the
    /// faulting task.
    pub const fn signal(self) -> Option<i32> {
        match self {
            FaultError::NoMapping | FaultError::AccessDenied => Some(SIGSEGV),
            FaultError::Bus | FaultError::Alignment | FaultError::HandlerGone => Some(SIGBUS),
            FaultError::OutOfMemory => None,
        }
    }

    /// The `si_code` of that signal: `SEGV_MAPERR` (1), `SEGV_ACCERR`
    /// (2), `BUS_ADRALN` (1) or `BUS_ADRERR` (2); `None` with no signal.
    pub const fn si_code(self) -> Option<i32> {
        match self {
            FaultError::NoMapping => Some(SEGV_MAPERR),
            FaultError::AccessDenied => Some(SEGV_ACCERR),
            FaultError::Alignment => Some(BUS_ADRALN),
            FaultError::Bus | FaultError::HandlerGone => Some(BUS_ADRERR),
            FaultError::OutOfMemory => None,
        }
    }
}

/// `SIGBUS`'s number on Linux x86-64.
pub const SIGBUS: i32 = 7;
/// `SIGSEGV`'s number on Linux x86-64.
pub const SIGSEGV: i32 = 11;
/// `si_code` of a `SIGSEGV` for an address no mapping covers.
pub const SEGV_MAPERR: i32 = 1;
/// `si_code` of a `SIGSEGV` for an access the mapping forbids.
pub const SEGV_ACCERR: i32 = 2;
/// `si_code` of a `SIGBUS` for a misaligned (split-lock) access.
pub const BUS_ADRALN: i32 = 1;
/// `si_code` of a `SIGBUS` for an address with no backing (past the end
/// of an object).
pub const BUS_ADRERR: i32 = 2;

impl fmt::Display for FaultError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultError::NoMapping => "SIGSEGV (SEGV_MAPERR): no mapping at the address",
            FaultError::AccessDenied => "SIGSEGV (SEGV_ACCERR): access denied by the mapping",
            FaultError::Bus => "SIGBUS (BUS_ADRERR): no backing object at the address",
            FaultError::Alignment => "SIGBUS (BUS_ADRALN): split-lock atomic operation",
            FaultError::OutOfMemory => "out of memory: memory budget exhausted",
            FaultError::HandlerGone => "SIGBUS: no userfault handler behind the registration",
        })
    }
}

impl std::error::Error for FaultError {}

impl From<FaultError> for Error {
    /// [`Error::PageFault`]: the kind is kept, the errno is
    /// [`FaultError::as_error`]'s.
    fn from(e: FaultError) -> Self {
        Error::PageFault(e)
    }
}

/// Result of address-space calls.
pub type Result<T, E = Error> = core::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_round_trips() {
        for e in [
            Error::Perm,
            Error::NoEnt,
            Error::Again,
            Error::NoMem,
            Error::AccessDenied,
            Error::Fault,
            Error::Busy,
            Error::Exist,
            Error::Inval,
        ] {
            assert_eq!(Error::from_errno(e.errno()), Some(e));
            assert!(e.to_string().contains(e.name()));
        }
        assert_eq!(Error::from_errno(0), None);
        assert_eq!(Error::Inval.errno(), 22);
        assert_eq!(Error::NoMem.errno(), 12);
        assert_eq!(Error::Exist.errno(), 17);
    }

    #[test]
    fn fault_errors_keep_their_kind_and_map_to_errno() {
        use std::error::Error as _;
        for (k, errno) in [
            (FaultError::NoMapping, 14),
            (FaultError::AccessDenied, 14),
            (FaultError::Bus, 14),
            (FaultError::OutOfMemory, 12),
        ] {
            let e = Error::from(k);
            assert_eq!(e, Error::PageFault(k));
            assert_eq!(e.errno(), errno);
            assert_eq!(e.source().unwrap().to_string(), k.to_string());
            let m = Error::Memory(MemoryFault {
                addr: 0x1000,
                kind: k,
                done: 3,
            });
            assert_eq!(m.errno(), errno);
            assert!(m.to_string().contains("at 0x1000 after 3 bytes"), "{m}");
            assert_eq!(std::io::Error::from(m).raw_os_error(), Some(errno));
        }
    }

    /// The siginfo of each kind, as Linux x86-64 numbers it.
    #[test]
    fn fault_kinds_give_signal_and_si_code() {
        for (k, sig, code) in [
            (FaultError::NoMapping, Some(SIGSEGV), Some(SEGV_MAPERR)),
            (FaultError::AccessDenied, Some(SIGSEGV), Some(SEGV_ACCERR)),
            (FaultError::Bus, Some(SIGBUS), Some(BUS_ADRERR)),
            (FaultError::Alignment, Some(SIGBUS), Some(BUS_ADRALN)),
            (FaultError::HandlerGone, Some(SIGBUS), Some(BUS_ADRERR)),
            (FaultError::OutOfMemory, None, None),
        ] {
            let m = MemoryFault {
                addr: 1,
                kind: k,
                done: 0,
            };
            assert_eq!((m.signal(), m.si_code()), (sig, code), "{k:?}");
        }
        assert_eq!((SIGSEGV, SIGBUS, SEGV_ACCERR, BUS_ADRALN), (11, 7, 2, 1));
        assert_eq!(FaultError::Alignment.errno(), 14);
    }
}
