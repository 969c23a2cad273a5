//! The file object a program's segments are mapped from: a file object
//! backed by the host file ([`Memfd::from_file_in`]), its pages read from
//! the host on first touch and charged to the space's frame pool, named
//! with the file's canonical path (so maps shows the path, device and
//! inode, as Linux's does). The two functions here are the only ones the
//! loader uses to reach files.

use super::ExecError;
use crate::{AddressSpace, MapFlags, Memfd, Prot};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A program or interpreter file, as the loader maps it.
pub(crate) type Object = Memfd;

/// Opens `path` as exec's `open_exec` would: a regular file with an
/// execute bit (else EACCES), read-only, as a file object charged to
/// `mm`'s pool (pages are read from the host as they are first touched).
pub(crate) fn open_object(mm: &AddressSpace, path: &Path) -> Result<Object, ExecError> {
    let real = std::fs::canonicalize(path)?;
    let f = std::fs::File::open(&real)?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(ExecError::Io(std::io::Error::from_raw_os_error(
            libc::EACCES,
        )));
    }
    Ok(Memfd::from_file_in(
        mm.frame_pool(),
        &f,
        &real.to_string_lossy(),
    )?)
}

/// `mmap(addr, len, prot, flags, obj, offset)`.
pub(crate) fn map_object(
    mm: &AddressSpace,
    addr: u64,
    len: u64,
    prot: Prot,
    flags: MapFlags,
    obj: &Object,
    offset: u64,
) -> Result<u64, ExecError> {
    Ok(mm.mmap_fd(addr, len, prot, flags, obj, offset)?)
}
