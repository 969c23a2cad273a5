//! Making objects: `memfd_create` (its flags, and the address space's
//! call that charges the object to the space) and file objects over host
//! files (the page cache of a `std::fs::File` or any descriptor).

use super::{own_allocator, Memfd, Mode, MAX_LEN};
use crate::error::{Error, Result};
use crate::file::{last_error, HostFile};
use crate::mm::AddressSpace;
use crate::phys::FrameAllocator;
use crate::sync::Arc;
use bitflags::bitflags;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};

bitflags! {
    /// `memfd_create` flags (`MFD_*`), with Linux's values.
    #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
    pub struct MemfdFlags: u32 {
        /// `MFD_CLOEXEC`: accepted (there is no exec of the handle).
        const CLOEXEC = 0x1;
        /// `MFD_ALLOW_SEALING`: accepted (no seals are kept).
        const ALLOW_SEALING = 0x2;
        /// `MFD_HUGETLB`: refused with `EINVAL` (there are no huge pages;
        /// Linux makes a hugetlbfs file).
        const HUGETLB = 0x4;
        /// `MFD_NOEXEC_SEAL`: accepted (the object is not executable
        /// anyway).
        const NOEXEC_SEAL = 0x8;
        /// `MFD_EXEC`: accepted.
        const EXEC = 0x10;
    }
}

impl AddressSpace {
    /// `memfd_create(2)`: a new, empty memory object named `name`, its
    /// pages charged to this space's budget (its
    /// [`frame_pool`](Self::frame_pool)); grow it with
    /// [`Memfd::set_len`] or writes, map it with
    /// [`mmap_fd`](Self::mmap_fd), here or in any space on the same
    /// physical memory.
    ///
    /// Errors as Linux's: `EINVAL` for an unknown flag, `EXEC` with
    /// `NOEXEC_SEAL`, a name longer than [`MAX_NAME_LEN`](super::MAX_NAME_LEN) bytes or holding
    /// a NUL byte, and (unlike Linux, which has hugetlbfs) `HUGETLB`.
    ///
    /// ```
    /// use aspace::{AddressSpace, Config, MapFlags, MemfdFlags, Prot};
    /// use std::io::Write;
    ///
    /// let mm = AddressSpace::new(Config::default());
    /// let mut m = mm.memfd_create("jit", MemfdFlags::CLOEXEC)?;
    /// m.write_all(b"code")?;
    /// let a = mm.mmap_fd(0, 4096, Prot::READ, MapFlags::SHARED, &m, 0)?;
    /// let mut buf = [0u8; 4];
    /// mm.read(a, &mut buf)?;
    /// assert_eq!(&buf, b"code");
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn memfd_create(&self, name: &str, flags: MemfdFlags) -> Result<Memfd> {
        let known = MemfdFlags::all().bits();
        if flags.bits() & !known != 0
            || flags.contains(MemfdFlags::HUGETLB)
            || flags.contains(MemfdFlags::EXEC | MemfdFlags::NOEXEC_SEAL)
        {
            return Err(Error::Inval);
        }
        Memfd::new_in(self.frame_pool(), name, 0)
    }
}

impl Memfd {
    /// A file object: the page cache of the host file `file` (a
    /// `std::fs::File`, an `OwnedFd`, any descriptor), whose pages are
    /// read from it on first use and written back to it (see
    /// [`crate::file`]), charged to an allocator of its own over the
    /// process's shared physical memory (as [`Memfd::new`]'s). The
    /// descriptor is duplicated: the object keeps the file open, and
    /// takes its access mode from it (`O_RDONLY`, `O_WRONLY`, `O_RDWR`),
    /// which [`AddressSpace::mmap_fd`] honours as Linux does. The size is
    /// the file's now. `name` is the path `maps` shows for its mappings,
    /// with the file's device and inode numbers
    /// ([`VmaInfo::file`](crate::VmaInfo::file)), as the kernel shows them.
    ///
    /// Errors: the host's for a descriptor it cannot duplicate or `fstat`
    /// (`EBADF`), `EINVAL` for a file larger than [`MAX_LEN`] or a name
    /// longer than a path may be (`PATH_MAX`, 4096 bytes) or holding a NUL.
    pub fn from_file(file: &impl AsFd, name: &str) -> Result<Memfd> {
        Self::from_file_in(&own_allocator(), file, name)
    }

    /// [`from_file`](Self::from_file) with the pages charged to `frames`.
    pub fn from_file_in(
        frames: &Arc<FrameAllocator>,
        file: &impl AsFd,
        name: &str,
    ) -> Result<Memfd> {
        if name.len() >= libc::PATH_MAX as usize || name.as_bytes().contains(&0) {
            return Err(Error::Inval);
        }
        let fd: OwnedFd = file.as_fd().try_clone_to_owned().map_err(io_error)?;
        // SAFETY: `fd` is an open descriptor we own; F_GETFL reads flags.
        let fl = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFL) };
        if fl < 0 {
            return Err(last_error());
        }
        let mode = match fl & libc::O_ACCMODE {
            libc::O_RDONLY => Mode {
                read: true,
                write: false,
            },
            libc::O_WRONLY => Mode {
                read: false,
                write: true,
            },
            _ => Mode {
                read: true,
                write: true,
            },
        };
        let (host, len) = HostFile::open(fd)?;
        if len > MAX_LEN {
            return Err(Error::Inval);
        }
        Ok(Self::make(frames, name, len, Some(host), mode))
    }
}

/// A `std::io::Error` from the host as ours (`EIO` when it has no errno
/// we know).
fn io_error(e: std::io::Error) -> Error {
    e.raw_os_error()
        .and_then(Error::from_errno)
        .unwrap_or(Error::Io)
}
