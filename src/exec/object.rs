//! The file object a program's segments are mapped from: for now the host
//! file's bytes copied into a [`Memfd`] charged to the space's frame pool,
//! named with the file's canonical path (so maps shows
//! `/memfd:/usr/bin/true (deleted)` where Linux shows `/usr/bin/true`).
//! The two functions here are the only ones that know it; a file object
//! backed by the host file replaces them without touching the loader.

use super::ExecError;
use crate::{AddressSpace, MapFlags, Memfd, Prot};
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// A program or interpreter file, as the loader maps it.
pub(crate) type Object = Memfd;

/// Bytes copied from the host file per read.
const CHUNK: usize = 64 << 10;

/// Opens `path` as exec's `open_exec` would: a regular file with an
/// execute bit (else EACCES), read into an object charged to `mm`'s pool
/// (ENOMEM past its budget; the copy goes through one 64 KiB buffer).
/// A canonical path over 249 bytes cannot name a memfd: EINVAL, until
/// host-file objects replace this.
pub(crate) fn open_object(mm: &AddressSpace, path: &Path) -> Result<Object, ExecError> {
    let real = std::fs::canonicalize(path)?;
    let mut f = std::fs::File::open(&real)?;
    let meta = f.metadata()?;
    if !meta.is_file() || meta.permissions().mode() & 0o111 == 0 {
        return Err(ExecError::Io(std::io::Error::from_raw_os_error(
            libc::EACCES,
        )));
    }
    let name = real.to_string_lossy();
    let obj = Memfd::new_in(mm.frame_pool(), &name, meta.len())?;
    let mut buf = vec![0u8; CHUNK];
    let mut at = 0u64;
    while at < meta.len() {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break; // the file shrank: the rest reads as zeros
        }
        // Never past the size the object was made with.
        let n = n.min(usize::try_from(meta.len() - at).unwrap_or(usize::MAX));
        obj.write_at(at, &buf[..n])?;
        at += n as u64;
    }
    Ok(obj)
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
