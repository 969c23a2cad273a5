//! Errors, numbered like Linux's errno values.

use core::fmt;

/// An error from an address-space call, with the errno Linux returns for the
/// same call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Error {
    /// `EPERM`: the operation is not permitted (e.g. below `mmap_min_addr`).
    Perm,
    /// `EAGAIN`: a resource is temporarily unavailable.
    Again,
    /// `ENOMEM`: no room, no memory, a hole in the range, or too many maps.
    NoMem,
    /// `EACCES`: the protection asked for is not allowed.
    Acces,
    /// `EFAULT`: an address is not mapped or not accessible.
    Fault,
    /// `EBUSY`: the resource is busy.
    Busy,
    /// `EEXIST`: the range is already mapped (`MAP_FIXED_NOREPLACE`).
    Exist,
    /// `EINVAL`: an argument is invalid (alignment, length, flags).
    Inval,
}

impl Error {
    /// The Linux errno value of this error.
    pub const fn errno(self) -> i32 {
        match self {
            Error::Perm => 1,
            Error::Again => 11,
            Error::NoMem => 12,
            Error::Acces => 13,
            Error::Fault => 14,
            Error::Busy => 16,
            Error::Exist => 17,
            Error::Inval => 22,
        }
    }

    /// The error with Linux errno value `errno`, if it is one of ours.
    pub const fn from_errno(errno: i32) -> Option<Error> {
        Some(match errno {
            1 => Error::Perm,
            11 => Error::Again,
            12 => Error::NoMem,
            13 => Error::Acces,
            14 => Error::Fault,
            16 => Error::Busy,
            17 => Error::Exist,
            22 => Error::Inval,
            _ => return None,
        })
    }

    /// The symbolic name, e.g. `"EINVAL"`.
    pub const fn name(self) -> &'static str {
        match self {
            Error::Perm => "EPERM",
            Error::Again => "EAGAIN",
            Error::NoMem => "ENOMEM",
            Error::Acces => "EACCES",
            Error::Fault => "EFAULT",
            Error::Busy => "EBUSY",
            Error::Exist => "EEXIST",
            Error::Inval => "EINVAL",
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (errno {})", self.name(), self.errno())
    }
}

impl std::error::Error for Error {}

/// Why a page fault could not be resolved: what Linux would deliver as a
/// signal to the faulting task.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FaultError {
    /// No VMA covers the address (`SIGSEGV`, `SEGV_MAPERR`).
    NoMapping,
    /// A VMA covers it but forbids this access (`SIGSEGV`, `SEGV_ACCERR`).
    AccessDenied,
    /// The mapping has no backing at this offset, e.g. the part of a shared
    /// mapping grown past its object with mremap (`SIGBUS`).
    Bus,
    /// The memory budget has no room for a frame or a page-table page
    /// (`VM_FAULT_OOM`).
    OutOfMemory,
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
}

impl fmt::Display for FaultError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            FaultError::NoMapping => "SIGSEGV (SEGV_MAPERR): no mapping at the address",
            FaultError::AccessDenied => "SIGSEGV (SEGV_ACCERR): access denied by the mapping",
            FaultError::Bus => "SIGBUS: no backing object at the address",
            FaultError::OutOfMemory => "out of memory: memory budget exhausted",
        })
    }
}

impl std::error::Error for FaultError {}

impl From<FaultError> for Error {
    fn from(e: FaultError) -> Self {
        e.as_error()
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
            Error::Again,
            Error::NoMem,
            Error::Acces,
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
    fn fault_errors_map_to_errno() {
        assert_eq!(Error::from(FaultError::NoMapping), Error::Fault);
        assert_eq!(Error::from(FaultError::AccessDenied), Error::Fault);
        assert_eq!(Error::from(FaultError::Bus), Error::Fault);
        assert_eq!(Error::from(FaultError::OutOfMemory), Error::NoMem);
    }
}
