//! Memory objects: [`Memfd`], a sized, named object of pages like Linux's
//! `memfd_create` file, read and written by offset (`pread`/`pwrite`, in
//! the argument order of std's `FileExt`), as a stream
//! (`std::io::{Read, Write, Seek}`, with the handle's own offset) and
//! resized by [`Memfd::set_len`] (`ftruncate`); or the page cache of a
//! host file ([`Memfd::from_file`]: pages read from the file on first use
//! and written back to it, see [`crate::file`]). Both kinds map the same
//! way ([`AddressSpace::mmap_fd`](crate::AddressSpace::mmap_fd)).
//!
//! Its pages live in the same sparse radix tree as the object behind a
//! shared anonymous mapping (`vma::Shmem`, the page cache's xarray): a
//! shared anonymous mapping is a memfd without a name, as in Linux. The
//! tree is sized for the largest object (`MAX_LFS_FILESIZE`) and costs only
//! the nodes on the paths to the pages touched.
//!
//! # Charging
//!
//! An object's frames (its pages: the page cache) and tree nodes are
//! charged to one [`FrameAllocator`] and its budget: the allocator given
//! to [`Memfd::new_in`] or [`Memfd::from_file_in`] (pass
//! [`AddressSpace::frame_pool`](crate::AddressSpace::frame_pool), or use
//! [`AddressSpace::memfd_create`](crate::AddressSpace::memfd_create), to
//! charge an address space's budget), or, for [`Memfd::new`] and
//! [`Memfd::from_file`], an allocator of its own with a 4 GiB budget over
//! the process's shared physical memory ([`FrameAllocator::shared`]),
//! which every [`AddressSpace::new`](crate::AddressSpace::new) space uses
//! too: any object maps into any such space, with no pool planned ahead.
//!
//! - A page of the object is charged once, to the object's allocator,
//!   however many mappings in however many spaces map it (100 spaces
//!   mapping one library use one copy of each page it has read).
//! - A private copy-on-write copy is charged to the space that wrote it;
//!   page tables to each space.
//! - A page stays charged to the allocator that allocated it until it is
//!   freed, even if that allocator dropped first (its budget then lingers
//!   until its last page goes, as a dead memcg does in Linux).
//! - Objects and spaces on different physical memories (allocators made
//!   with [`FrameAllocator::new`]) cannot map each other: `mmap_fd` fails
//!   with `EXDEV` ([`Error::CrossDevice`]).
//!
//! Fresh pages read as zeros when the pool zeroes frames
//! ([`FrameAllocator::zeroes_frames`]), as the shared physical memory
//! does.
//!
//! # Locking
//!
//! `size` is a reader-writer lock: [`Memfd::read_at`] and in-bounds
//! [`Memfd::write_at`] hold its read side while they copy, so the size
//! they checked stays valid; [`Memfd::set_len`] and extending writes hold
//! its write side, so a shrink never frees a page a copy is using. Pages
//! are installed in the tree lock-free (compare-and-swap).
//!
//! Mappings vs truncation: every VMA mapping the object is filed in its
//! mappings (`vma::mappings`, Linux's `i_mmap`); a shrink, under `size`'s
//! write side, lowers the end, zaps the pages past it in every mapping
//! under that index's lock and PTE locks, then frees them. Faults take
//! no lock of the object: they re-check its end under the PTE lock (the
//! argument is in `vma::mappings`). Lock order: `size`, then the mappings
//! lock, then PTE locks, the frame allocator's and the TLB flush lock; no
//! mmap_lock is taken under `size` (see [`crate::mm`]).

use crate::addr::{PAGE_SHIFT, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::phys::FrameAllocator;
use crate::sync::{Arc, Mutex, RwLock};
use crate::vma::Shmem;

mod open;
mod stream;

pub use crate::file::FileStats;
pub use open::MemfdFlags;

/// Longest name `memfd_create` accepts, in bytes (`MFD_NAME_MAX_LEN`).
pub const MAX_NAME_LEN: usize = 249;

/// Largest object size in bytes (`MAX_LFS_FILESIZE`, tmpfs's limit).
pub const MAX_LEN: u64 = i64::MAX as u64;

/// Pages the tree indexes: enough for an object of [`MAX_LEN`] bytes.
const MAX_PAGES: u64 = (MAX_LEN >> PAGE_SHIFT) + 1;

/// Memory budget of the allocator [`Memfd::new`] makes (the default
/// [`Config`](crate::Config)'s).
const OWN_POOL_BYTES: u64 = 4 << 30;

/// What a handle was opened for (`O_RDONLY`, `O_WRONLY`, `O_RDWR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Mode {
    /// Reads allowed (`FMODE_READ`); every mapping needs it.
    pub(crate) read: bool,
    /// Writes allowed (`FMODE_WRITE`); a shared mapping without it has
    /// no `VM_MAYWRITE`.
    pub(crate) write: bool,
}

impl Mode {
    const READ_WRITE: Mode = Mode {
        read: true,
        write: true,
    };
}

/// A memory object: a named, resizable sequence of bytes backed by frames,
/// like a file from Linux's `memfd_create`.
///
/// Cloning is cheap and shares the object, like `dup` on its descriptor:
/// a write through one handle is read through every other. The pages are
/// freed when the last handle drops.
///
/// ```
/// use aspace::Memfd;
///
/// let m = Memfd::new("image", 10_000)?;
/// assert_eq!(m.write_at(b"hello", 4090)?, 5);
/// let other = m.clone();
/// let mut buf = [0u8; 8];
/// assert_eq!(other.read_at(&mut buf, 4088)?, 8);
/// assert_eq!(&buf, b"\0\0hello\0");
/// m.set_len(4092)?; // drops the bytes past the new end
/// assert_eq!(other.read_at(&mut buf, 4088)?, 4);
/// m.set_len(8192)?; // grows with zeros
/// assert_eq!(other.read_at(&mut buf, 4088)?, 8);
/// assert_eq!(&buf, b"\0\0he\0\0\0\0");
/// # Ok::<(), aspace::Error>(())
/// ```
#[derive(Clone)]
pub struct Memfd {
    inner: Arc<Inner>,
}

struct Inner {
    /// The pages, shared with every VMA mapping the object (each holds a
    /// reference), and the index of those VMAs.
    /// Protected by: the tree is lock-free; its end changes under `size`'s
    /// write side; the index has its own lock.
    pages: Arc<Shmem>,
    /// The size in bytes.
    ///
    /// Protected by: itself (read side for copies within the size, write
    /// side for any change of size).
    size: RwLock<u64>,
    /// What the handle was opened for.
    ///
    /// Protected by: immutable after creation.
    mode: Mode,
    /// The stream offset of `Read`, `Write` and `Seek` (shared by clones,
    /// as `dup`'d descriptors share their file description's).
    ///
    /// Protected by: its mutex, held across the whole copy so that two
    /// streams never use one offset (a leaf besides the size lock, taken
    /// before it).
    pos: Mutex<u64>,
}

impl Memfd {
    /// A new object named `name` of `len` zero bytes, with an allocator of
    /// its own (a 4 GiB budget over the process's shared physical memory,
    /// so that it maps into any [`AddressSpace::new`](crate::AddressSpace::new)
    /// space; see the module's `# Charging`).
    ///
    /// Errors as `memfd_create` then `ftruncate`: `EINVAL` for a name
    /// longer than [`MAX_NAME_LEN`] bytes or holding a NUL byte, or a
    /// length over [`MAX_LEN`].
    pub fn new(name: &str, len: u64) -> Result<Memfd> {
        Self::new_in(&own_allocator(), name, len)
    }

    /// A new object like [`new`](Self::new) whose frames and tree nodes
    /// are charged to `frames` (e.g. an address space's
    /// [`frame_pool`](crate::AddressSpace::frame_pool)).
    pub fn new_in(frames: &Arc<FrameAllocator>, name: &str, len: u64) -> Result<Memfd> {
        if name.len() > MAX_NAME_LEN || name.as_bytes().contains(&0) {
            return Err(Error::Inval);
        }
        if len > MAX_LEN {
            return Err(Error::Inval);
        }
        Ok(Self::make(frames, name, len, None, Mode::READ_WRITE))
    }

    /// An object of `len` bytes on `frames`, the page cache of `host` if
    /// given, opened for `mode`.
    fn make(
        frames: &Arc<FrameAllocator>,
        name: &str,
        len: u64,
        host: Option<crate::file::HostFile>,
        mode: Mode,
    ) -> Memfd {
        Memfd {
            inner: Arc::new(Inner {
                pages: Arc::new(Shmem::named(
                    crate::sync::counter::next_id(),
                    Some(name.into()),
                    MAX_PAGES,
                    len.div_ceil(PAGE_SIZE),
                    frames.clone(),
                    host,
                )),
                size: RwLock::new(len),
                mode,
                pos: Mutex::new(0),
            }),
        }
    }

    /// The name given at creation.
    pub fn name(&self) -> &str {
        self.inner.pages.name.as_deref().unwrap_or("")
    }

    /// The size in bytes (`fstat`'s `st_size`).
    pub fn len(&self) -> u64 {
        *self.inner.size.read()
    }

    /// True if the size is zero.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame pool the object's pages are charged to.
    pub fn frame_pool(&self) -> &Arc<FrameAllocator> {
        &self.inner.pages.frames
    }

    /// Resizes the object (`ftruncate`): growing adds zero bytes; shrinking
    /// drops the pages wholly past the new end and zeroes the tail of the
    /// last page, so a later growth reads zeros there. A shrink also
    /// unmaps the pages past the new end from every mapping of the object,
    /// in every address space, private copy-on-write copies included (as
    /// Linux's `truncate_pagecache`): a later access there is SIGBUS, and
    /// after a growth faults the new zeros in. A file object's host file
    /// is resized first (`ftruncate`), and the dirty pages dropped are
    /// not written back. `EINVAL` for a length over [`MAX_LEN`] or a
    /// handle not opened for writing (as `ftruncate`), the host's error
    /// if it refuses; nothing changes then.
    pub fn set_len(&self, len: u64) -> Result<()> {
        if len > MAX_LEN || !self.inner.mode.write {
            return Err(Error::Inval);
        }
        let mut size = self.inner.size.write();
        let pages = &self.inner.pages;
        // A file object's writeback waits until the host file and the
        // pages agree on the new size (`crate::file`'s `# Locking`).
        let _io = pages.host.as_ref().map(|host| host.io_lock());
        if let Some(host) = &pages.host {
            host.set_host_len(len)?;
            host.forget_from(len.div_ceil(PAGE_SIZE));
        }
        let end = len.div_ceil(PAGE_SIZE);
        if len < *size {
            // The three steps of `vma::mappings`' truncation: the end
            // first (new faults past it fail), then the mapped entries,
            // then the object's frames.
            pages.set_npages(end);
            crate::sync::asymmetric::heavy();
            pages.mappings.zap_from(end, &pages.frames);
            let tail = (len % PAGE_SIZE) as usize;
            if tail != 0 {
                if let Some(pfn) = pages.resident(len >> PAGE_SHIFT) {
                    let zeros = [0u8; PAGE_SIZE as usize];
                    pages.frames.write(pfn, tail, &zeros[tail..]);
                }
            }
            pages.truncate_from(end);
        }
        *size = len;
        pages.set_npages(end);
        Ok(())
    }

    /// Copies bytes from `offset` into `buf` (`pread`, in the argument
    /// order of `std::os::unix::fs::FileExt::read_at`): returns how many,
    /// fewer than `buf.len()` at the end of the object, 0 at or past it.
    /// Pages of a memory object never written read as zeros and are not
    /// allocated; a file object's pages are read from the host file into
    /// its page cache. `EINVAL` when `offset + buf.len()` passes
    /// [`MAX_LEN`], `EBADF` for a handle not opened for reading, the host's
    /// error when the file cannot be read (bytes before the failing page
    /// are copied, and counted, first).
    pub fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<usize> {
        if !self.inner.mode.read {
            return Err(Error::BadFd);
        }
        check_span(offset, buf.len())?;
        let size = self.inner.size.read();
        let n = usize::try_from(size.saturating_sub(offset))
            .unwrap_or(usize::MAX)
            .min(buf.len());
        let pages = &self.inner.pages;
        let mut done = 0;
        let r = self.for_pages(offset, n, |idx, in_page, at| {
            let chunk = &mut buf[at..at + in_page.len()];
            match pages.resident(idx) {
                Some(pfn) => pages.frames.read(pfn, in_page.start, chunk),
                None if pages.host.is_none() => chunk.fill(0),
                None => {
                    let pfn = pages.frame(idx)?;
                    pages.frames.read(pfn, in_page.start, chunk);
                }
            }
            done = at + chunk.len();
            Ok(())
        });
        match r {
            Err(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// Copies `data` into the object at `offset` (`pwrite`, in the
    /// argument order of `std::os::unix::fs::FileExt::write_at`), growing
    /// it if the write ends past its end; returns how many bytes were
    /// written. A file object's pages are dirty until written back
    /// ([`crate::file`]). `EINVAL` when `offset + data.len()` passes
    /// [`MAX_LEN`]; `EBADF` for a handle not opened for writing; `ENOMEM`
    /// when the pool has no frame for the first page, or the host's error
    /// when the first page cannot be read (a later page failing ends the
    /// write short, its bytes before that written).
    pub fn write_at(&self, data: &[u8], offset: u64) -> Result<usize> {
        if !self.inner.mode.write {
            return Err(Error::BadFd);
        }
        let end = check_span(offset, data.len())?;
        if data.is_empty() {
            return Ok(0);
        }
        let pages = &self.inner.pages;
        let mut done = 0;
        let mut copy = || {
            self.for_pages(offset, data.len(), |idx, in_page, at| {
                let pfn = pages.frame(idx)?;
                pages
                    .frames
                    .write(pfn, in_page.start, &data[at..at + in_page.len()]);
                if let Some(host) = &pages.host {
                    host.mark_written(idx);
                }
                done = at + in_page.len();
                Ok(())
            })
        };
        let r = {
            let size = self.inner.size.read();
            if end <= *size {
                Some(copy())
            } else {
                None
            }
        };
        let r = match r {
            Some(r) => r,
            None => {
                let mut size = self.inner.size.write();
                let _io = pages.host.as_ref().map(|host| host.io_lock());
                let r = copy();
                // The object grows to the end of what was written.
                *size = (*size).max(offset + done as u64);
                pages.set_npages(size.div_ceil(PAGE_SIZE));
                if let Some(host) = &pages.host {
                    host.set_size(*size);
                }
                r
            }
        };
        match r {
            Err(e) if done == 0 => Err(e),
            _ => Ok(done),
        }
    }

    /// The object's pages, to map them.
    pub(crate) fn pages(&self) -> &Arc<Shmem> {
        &self.inner.pages
    }

    /// What the handle was opened for.
    pub(crate) fn mode(&self) -> Mode {
        self.inner.mode
    }

    /// Writes the object's dirty pages back to its host file and flushes
    /// it (`fsync`); nothing for a memory object. The host's error if a
    /// write or the flush fails (the pages not written stay dirty).
    pub fn sync_all(&self) -> Result<()> {
        let pages = &self.inner.pages;
        let Some(host) = &pages.host else {
            return Ok(());
        };
        pages.writeback(0, u64::MAX)?;
        host.fsync()
    }

    /// The host I/O done for a file object (pages read on first use and
    /// written back); zeros for a memory object.
    pub fn file_stats(&self) -> FileStats {
        self.inner
            .pages
            .host
            .as_ref()
            .map_or(FileStats::default(), |h| h.stats())
    }

    /// Calls `f(page index, byte range within the page, offset into the
    /// caller's buffer)` for each page of `[offset, offset + n)`, stopping
    /// at the first error.
    fn for_pages(
        &self,
        offset: u64,
        n: usize,
        mut f: impl FnMut(u64, core::ops::Range<usize>, usize) -> Result<()>,
    ) -> Result<()> {
        let mut at = 0usize;
        while at < n {
            let pos = offset + at as u64;
            let start = (pos % PAGE_SIZE) as usize;
            let len = (PAGE_SIZE as usize - start).min(n - at);
            f(pos >> PAGE_SHIFT, start..start + len, at)?;
            at += len;
        }
        Ok(())
    }
}

/// The allocator of an object made without one: its own budget over the
/// process's shared physical memory.
fn own_allocator() -> Arc<FrameAllocator> {
    Arc::new(FrameAllocator::shared(OWN_POOL_BYTES))
}

/// Checks `offset + len` against [`MAX_LEN`] as `rw_verify_area` does;
/// returns the end.
fn check_span(offset: u64, len: usize) -> Result<u64> {
    offset
        .checked_add(len as u64)
        .filter(|&end| end <= MAX_LEN)
        .ok_or(Error::Inval)
}

impl core::fmt::Debug for Memfd {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("Memfd")
            .field("name", &self.name())
            .field("len", &self.len())
            .field("id", &self.inner.pages.id)
            .finish()
    }
}
