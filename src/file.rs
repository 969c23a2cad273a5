//! Host files behind memory objects: the page cache's side of a
//! [`Memfd`](crate::Memfd) made from a host file
//! ([`Memfd::from_file`](crate::Memfd::from_file)).
//!
//! The object's pages (`vma::Shmem`) are the file's page cache: a page is
//! read from the host (`pread`) into a frame the first time anything
//! needs it — a fault in any mapping of any address space, a
//! [`read_at`](crate::Memfd::read_at), a partial
//! [`write_at`](crate::Memfd::write_at) — and stays shared by every user
//! until the object shrinks or drops. Bytes past the end of the file in
//! its last page read as zeros, as Linux's page cache fills them.
//!
//! Writeback: a page is dirty once a [`write_at`](crate::Memfd::write_at)
//! copied into it, or once it was mapped by a shared mapping that may
//! write it (`VM_SHARED` with `VM_MAYWRITE`). Stores through a mapping do
//! not fault again once the entry is writable, so a page handed to such a
//! mapping is written back at every sync while it is resident (Linux
//! write-protects it again after writeback to see the next store; the
//! simulated entries keep no dirty bit to do that with). Dirty pages are
//! written back (`pwrite`) by `msync(MS_SYNC)` over a shared mapping, by
//! the unmapping of a shared mapping (for its range), by
//! [`Memfd::sync_all`](crate::Memfd::sync_all), and when the object
//! drops.
//!
//! The host file is not watched: a change made to it by another process
//! after a page was cached is not seen, and writeback overwrites it (the
//! object is this process's page cache of the file, not the host's).
//!
//! # Locking
//!
//! `io` orders writeback against changes of the object's size: a
//! writeback holds it from taking the dirty pages and the size to its
//! last `pwrite`; a shrink holds it (under the object's size lock) from
//! resizing the host file until the pages past the new end are freed,
//! and an extending write while it copies and sets the size. So a
//! writeback never writes a page a shrink dropped back into the file,
//! nor clips a page to a size an extending write is about to raise. In
//! the crate's [lock order](crate::mm#locking) it comes after the size
//! lock and the mmap_lock (munmap writes back under its write side) and
//! before a shared object's mappings lock. `dirty` is a leaf mutex, held
//! only to update or take the set (never across host I/O). Host reads run
//! with no lock of the object: the page is published into the object's
//! tree by compare-and-swap after it is filled, so every user sees a
//! whole page.

use crate::addr::{PAGE_SHIFT, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::sync::counter::{AtomicU64 as CounterU64, Ordering as CounterOrdering};
use crate::sync::{Mutex, MutexGuard};
use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd};

/// How a page of the object is dirty.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Dirty {
    /// Written by a copy; clean again after writeback.
    Once,
    /// Mapped by a shared mapping that may store to it: written back at
    /// every sync while resident.
    Mapped,
}

/// Counts of host I/O done for a file object, by pages
/// ([`Memfd::file_stats`](crate::Memfd::file_stats)).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FileStats {
    /// Pages read from the host file (`pread` of a page on first use).
    pub pages_read: u64,
    /// Pages written back to the host file (`pwrite`).
    pub pages_written: u64,
}

/// The host file a mapping maps, as `/proc/pid/maps` names it
/// ([`VmaInfo::file`](crate::VmaInfo::file)).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct MappedFile {
    /// The name given to [`Memfd::from_file`](crate::Memfd::from_file)
    /// (its path, for maps to match the kernel's).
    pub path: String,
    /// The device holding the file (`st_dev`'s major and minor numbers).
    pub dev: (u32, u32),
    /// The file's inode number (`st_ino`).
    pub inode: u64,
}

/// A host file as the backing store of an object's pages.
pub(crate) struct HostFile {
    /// The host descriptor (a duplicate the object owns).
    ///
    /// Protected by: immutable after creation; positional I/O only.
    fd: OwnedFd,
    /// The file's device and inode numbers, from `fstat` at open.
    ///
    /// Protected by: immutable after creation.
    id: (u64, u64),
    /// Whether the file's file system places mappings 2 MiB-aligned
    /// (`fstatfs` at open: see [`fs_aligns_placement`]).
    ///
    /// Protected by: immutable after creation.
    aligns: bool,
    /// Held by writeback and by size changes (see the module's
    /// `# Locking`).
    ///
    /// Protected by: immutable after creation (it is the lock).
    io: Mutex<()>,
    /// Pages written since their last writeback, by page index.
    ///
    /// Protected by: its mutex (a leaf).
    dirty: Mutex<BTreeMap<u64, Dirty>>,
    /// The object's size in bytes, which writeback clips the last page to.
    ///
    /// Protected by: a counter atomic, stored under the object's size
    /// lock (`Memfd`'s); writeback reads it `Relaxed` (a shrink racing a
    /// writeback forgets the pages it drops first, see `forget_from`).
    size: CounterU64,
    /// Protected by: counter atomics, `Relaxed` (statistics).
    reads: CounterU64,
    /// See `reads`.
    writes: CounterU64,
}

impl HostFile {
    /// The backing of the file open at `fd`, and the file's size.
    pub(crate) fn open(fd: OwnedFd) -> Result<(HostFile, u64)> {
        let st = fstat(&fd)?;
        let size = u64::try_from(st.st_size).map_err(|_| Error::Overflow)?;
        let id = (st.st_dev, st.st_ino);
        let aligns = fs_aligns_placement(&fd);
        Ok((Self::new(fd, id, size, aligns), size))
    }

    fn new(fd: OwnedFd, id: (u64, u64), size: u64, aligns: bool) -> Self {
        HostFile {
            fd,
            id,
            aligns,
            io: Mutex::new(()),
            size: CounterU64::new(size),
            dirty: Mutex::new(BTreeMap::new()),
            reads: CounterU64::new(0),
            writes: CounterU64::new(0),
        }
    }

    /// Whether the host places mappings of this file 2 MiB-aligned.
    pub(crate) fn aligns_placement(&self) -> bool {
        self.aligns
    }

    /// Excludes writeback while the object's size changes (see the
    /// module's `# Locking`).
    pub(crate) fn io_lock(&self) -> MutexGuard<'_, ()> {
        self.io.lock()
    }

    /// The file as maps names it, with `path` as its name.
    pub(crate) fn mapped_file(&self, path: &str) -> MappedFile {
        MappedFile {
            path: path.to_string(),
            dev: (libc::major(self.id.0), libc::minor(self.id.0)),
            inode: self.id.1,
        }
    }

    /// Sets the host file's size (`ftruncate`) and the object's.
    pub(crate) fn set_host_len(&self, len: u64) -> Result<()> {
        let off = libc::off_t::try_from(len).map_err(|_| Error::Inval)?;
        // SAFETY: `fd` is an open descriptor we own.
        if unsafe { libc::ftruncate(self.fd.as_raw_fd(), off) } != 0 {
            return Err(last_error());
        }
        self.set_size(len);
        Ok(())
    }

    /// Records the object's size (an extending write: the host file grows
    /// when the bytes are written back).
    pub(crate) fn set_size(&self, len: u64) {
        self.size.store(len, CounterOrdering::Relaxed);
    }

    /// Fills `page` (4096 bytes) with page `index` of the host file, zeros
    /// past its end.
    pub(crate) fn read_page(&self, index: u64, page: &mut [u8]) -> Result<()> {
        debug_assert_eq!(page.len(), PAGE_SIZE as usize);
        let mut done = 0;
        let base = index.checked_mul(PAGE_SIZE).ok_or(Error::Overflow)?;
        while done < page.len() {
            let off = libc::off_t::try_from(base + done as u64).map_err(|_| Error::Overflow)?;
            let rest = &mut page[done..];
            // SAFETY: `rest` is a writable buffer of `rest.len()` bytes.
            let n = unsafe {
                libc::pread(
                    self.fd.as_raw_fd(),
                    rest.as_mut_ptr().cast(),
                    rest.len(),
                    off,
                )
            };
            match n {
                0 => break,
                n if n > 0 => done += n as usize,
                _ if errno() == libc::EINTR => {}
                _ => return Err(last_error()),
            }
        }
        page[done..].fill(0);
        self.reads.fetch_add(1, CounterOrdering::Relaxed);
        Ok(())
    }

    /// Writes `data` at byte `offset` of the host file.
    fn write_all_at(&self, data: &[u8], offset: u64) -> Result<()> {
        let mut done = 0;
        while done < data.len() {
            let off = libc::off_t::try_from(offset + done as u64).map_err(|_| Error::Overflow)?;
            let rest = &data[done..];
            // SAFETY: `rest` is a readable buffer of `rest.len()` bytes.
            let n =
                unsafe { libc::pwrite(self.fd.as_raw_fd(), rest.as_ptr().cast(), rest.len(), off) };
            if n > 0 {
                done += n as usize;
            } else if n < 0 && errno() == libc::EINTR {
                continue;
            } else {
                return Err(if n == 0 { Error::Io } else { last_error() });
            }
        }
        Ok(())
    }

    /// Records that page `index` was written by a copy.
    pub(crate) fn mark_written(&self, index: u64) {
        self.dirty.lock().entry(index).or_insert(Dirty::Once);
    }

    /// Records that page `index` was handed to a shared mapping that may
    /// store to it.
    pub(crate) fn mark_mapped(&self, index: u64) {
        self.dirty.lock().insert(index, Dirty::Mapped);
    }

    /// Forgets the pages from `from` on (a shrink dropped them).
    pub(crate) fn forget_from(&self, from: u64) {
        drop(self.dirty.lock().split_off(&from));
    }

    /// Writes back the dirty pages in `[first, end)` (indices), each with
    /// `page(index, buf)` filling `buf` with the page's bytes (false: the
    /// page is no longer resident, nothing to write), clipped to the
    /// object's size. Pages written by a copy are clean afterwards; mapped
    /// ones stay dirty. The first host error ends it; the pages not
    /// written stay dirty.
    pub(crate) fn writeback(
        &self,
        first: u64,
        end: u64,
        mut page: impl FnMut(u64, &mut [u8]) -> bool,
    ) -> Result<()> {
        let _io = self.io.lock();
        let size = self.size.load(CounterOrdering::Relaxed);
        if first >= end {
            return Ok(());
        }
        let todo: Vec<(u64, Dirty)> = {
            let mut d = self.dirty.lock();
            let todo: Vec<(u64, Dirty)> = d.range(first..end).map(|(&i, &k)| (i, k)).collect();
            for &(i, k) in &todo {
                if k == Dirty::Once {
                    d.remove(&i);
                }
            }
            todo
        };
        let mut buf = vec![0u8; PAGE_SIZE as usize];
        for (n, &(index, _)) in todo.iter().enumerate() {
            let at = index << PAGE_SHIFT;
            if at >= size || !page(index, &mut buf) {
                continue;
            }
            let len = (size - at).min(PAGE_SIZE) as usize;
            if let Err(e) = self.write_all_at(&buf[..len], at) {
                let mut d = self.dirty.lock();
                for &(i, k) in &todo[n..] {
                    d.entry(i).or_insert(k);
                }
                return Err(e);
            }
            self.writes.fetch_add(1, CounterOrdering::Relaxed);
        }
        Ok(())
    }

    /// Flushes the host file to its storage (`fsync`).
    pub(crate) fn fsync(&self) -> Result<()> {
        // SAFETY: `fd` is an open descriptor we own.
        if unsafe { libc::fsync(self.fd.as_raw_fd()) } != 0 {
            return Err(last_error());
        }
        Ok(())
    }

    /// The host I/O done so far.
    pub(crate) fn stats(&self) -> FileStats {
        FileStats {
            pages_read: self.reads.load(CounterOrdering::Relaxed),
            pages_written: self.writes.load(CounterOrdering::Relaxed),
        }
    }
}

/// Whether Linux places mappings of the file at `fd` 2 MiB-aligned: its
/// file system's mmap uses `thp_get_unmapped_area` (ext2/3/4, which share
/// a magic number, and XFS; measured for ext4 and tmpfs on Linux 6.18). A
/// file system `fstatfs` cannot name does not.
fn fs_aligns_placement(fd: &OwnedFd) -> bool {
    const EXT_SUPER_MAGIC: i64 = 0xEF53;
    const XFS_SUPER_MAGIC: i64 = 0x5846_5342;
    // SAFETY: an all-zero `statfs` is a valid value of the plain C struct,
    // and fstatfs writes it whole on success.
    let mut st: libc::statfs = unsafe { core::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor; `st` is writable.
    if unsafe { libc::fstatfs(fd.as_raw_fd(), &mut st) } != 0 {
        return false;
    }
    matches!(st.f_type as i64, EXT_SUPER_MAGIC | XFS_SUPER_MAGIC)
}

/// `fstat` of `fd`.
fn fstat(fd: &OwnedFd) -> Result<libc::stat> {
    // SAFETY: an all-zero `stat` is a valid value of the plain C struct,
    // and fstat writes it whole on success.
    let mut st: libc::stat = unsafe { core::mem::zeroed() };
    // SAFETY: `fd` is an open descriptor; `st` is writable.
    if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
        return Err(last_error());
    }
    Ok(st)
}

/// The calling thread's errno.
fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

/// The calling thread's errno as an error: ours where we have it, `EIO`
/// otherwise.
pub(crate) fn last_error() -> Error {
    Error::from_errno(errno()).unwrap_or(Error::Io)
}
