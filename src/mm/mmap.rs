//! mmap: argument checks in Linux's order, placement, and the new VMA.
//!
//! # Locking
//!
//! The mmap_lock write side through `Edit`; population (MAP_POPULATE,
//! MAP_LOCKED) after it is released, as ordinary faults. Order:
//! [`crate::mm`].

use super::edit::{Edit, Reach, View, VmaSpec};
use super::placement::Backing;
use super::{next_id, AddressSpace, MapFlags, Prot};
use crate::addr::{page_align_up, Range, PAGE_SHIFT, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::memfd::Memfd;
use crate::sync::Arc;
use crate::vma::{Shmem, VmFlags};

/// The object of a file mapping: its pages, the page offset mapped from,
/// and the handle's access mode.
#[derive(Clone, Copy)]
struct Object<'a> {
    pages: &'a Arc<Shmem>,
    pgoff: u64,
    mode: crate::memfd::Mode,
}

/// Linux's `LEGACY_MAP_MASK`: the flags `MAP_SHARED_VALIDATE` accepts on
/// a file whose `mmap_supported_flags` add none (tmpfs, so a memfd):
/// the type bits, `FIXED`, `ANONYMOUS`, `MAP_DENYWRITE` (0x800),
/// `MAP_EXECUTABLE` (0x1000), `MAP_UNINITIALIZED` (0x400_0000),
/// `GROWSDOWN`, `LOCKED`, `NORESERVE`, `POPULATE`, `NONBLOCK`, `STACK`,
/// `HUGETLB`, `BIT32`, `MAP_ABOVE4G` (0x80, Linux 6.5+), and the bits of `MAP_HUGE_2MB` and `MAP_HUGE_1GB`
/// (sizes 21 and 30 in [`MapFlags::HUGE_SHIFT`]).
const LEGACY_MAP_MASK: u32 = MapFlags::SHARED.bits()
    | MapFlags::PRIVATE.bits()
    | MapFlags::FIXED.bits()
    | MapFlags::ANONYMOUS.bits()
    | 0x800
    | 0x1000
    | 0x400_0000
    | MapFlags::GROWSDOWN.bits()
    | MapFlags::LOCKED.bits()
    | MapFlags::NORESERVE.bits()
    | MapFlags::POPULATE.bits()
    | MapFlags::NONBLOCK.bits()
    | MapFlags::STACK.bits()
    | MapFlags::HUGETLB.bits()
    | MapFlags::BIT32.bits()
    | 0x80
    | 21 << MapFlags::HUGE_SHIFT
    | 30 << MapFlags::HUGE_SHIFT;

impl AddressSpace {
    /// Maps `len` bytes of anonymous memory, like `mmap(2)`.
    ///
    /// `addr` is a hint (0 for none) unless `FIXED` or `FIXED_NOREPLACE`
    /// is given. Returns the address of the mapping.
    ///
    /// Flags as Linux's: unknown bits are ignored; `LOCKED` sets
    /// `VM_LOCKED` and populates, `STACK` sets `VM_NOHUGEPAGE`, `SYNC`
    /// sets `VM_SYNC`, `BIT32` places the mapping in `[1 GiB, 2 GiB)`.
    ///
    /// Errors, in Linux's order: `HUGETLB` fails first (`ENOMEM`: there is
    /// no huge page pool; `EINVAL` for a bad size or a fixed address not
    /// aligned to it); `EINVAL` for zero
    /// `len`; `ENOMEM` when the
    /// page-rounded length overflows, the map count is at its limit, the
    /// length or a fixed range exceeds the task size, or no gap fits;
    /// `EINVAL` for an unaligned fixed address; `EPERM` for a fixed address
    /// below `mmap_min_addr`; `EEXIST` when `FIXED_NOREPLACE` overlaps a
    /// mapping; `EPERM` for `LOCKED` with a memlock limit of 0, `EAGAIN`
    /// when a lock (`LOCKED`, or `mlockall(MCL_FUTURE)`) would pass the
    /// limit; `EINVAL` when the type field ([`MapFlags::TYPE`]) is none of
    /// `SHARED`, `PRIVATE` and `DROPPABLE` (`SHARED | PRIVATE`, Linux's
    /// `MAP_SHARED_VALIDATE`, is for files only), when `GROWSDOWN` comes
    /// with `SHARED` or `DROPPABLE`, or `LOCKED` with `DROPPABLE`; then
    /// `ENOMEM` when the memory budget has no room for the new VMA.
    pub fn mmap(&self, addr: u64, len: u64, prot: Prot, flags: MapFlags) -> Result<u64> {
        self.do_mmap(addr, len, prot, flags, None)
    }

    /// Maps `len` bytes of the memory object `memfd` from byte `offset`,
    /// like `mmap(2)` on a memfd's descriptor.
    ///
    /// `MAP_SHARED` (or `MAP_SHARED_VALIDATE`): loads and stores reach the
    /// object's pages, seen by [`Memfd::read_at`], every other mapping and
    /// fork children. `MAP_PRIVATE`: copy-on-write over the object: a read
    /// fault maps the object's page read-only, the first write copies it
    /// into a private page; `MADV_DONTNEED` drops the copies, so the
    /// object's bytes show again. A fault at or past the object's end
    /// (page index `>= ceil(len / 4096)`) is `SIGBUS`
    /// ([`FaultError::Bus`](crate::error::FaultError::Bus)), also after a shrink
    /// ([`Memfd::set_len`]) unmapped the pages past the new end, private
    /// copies included, as Linux's truncation does. Adjacent mappings of
    /// the same object at contiguous offsets merge, as in Linux.
    ///
    /// A file object ([`Memfd::from_file`]) is mapped the same way: its
    /// pages are read from the host file on first touch, shared by every
    /// mapping in every space; shared stores are written back by
    /// [`msync`](Self::msync) with `MS_SYNC`, by the munmap of the
    /// mapping and when the object drops ([`crate::file`]). The handle's
    /// access mode is honoured as Linux's `do_mmap` does: a shared mapping
    /// of a read-only handle has neither `VM_MAYWRITE` nor `VM_SHARED`
    /// (maps still shows `s`), so `mprotect(PROT_WRITE)` fails with
    /// `EACCES`; a private one may be written (copy-on-write).
    ///
    /// Any object maps into any space on the same physical memory: every
    /// [`AddressSpace::new`](Self::new) space and every object made
    /// without an allocator share the process's (see [`crate::memfd`]'s
    /// `# Charging` for who pays for which page).
    ///
    /// Errors as [`mmap`](Self::mmap), with the object's first: `EINVAL`
    /// for an offset not a multiple of the page size, then (unless
    /// `ANONYMOUS`, which maps anonymous memory as [`mmap`](Self::mmap),
    /// ignoring the object, as Linux ignores the descriptor) `EINVAL` for
    /// `HUGETLB`, then `EXDEV` ([`Error::CrossDevice`]) for an object
    /// whose frames live in another physical memory than this space's
    /// (either made on a [`FrameAllocator::new`](crate::FrameAllocator::new)
    /// pool of its own); `EOVERFLOW` when `offset + len` passes the
    /// largest object size; `EOPNOTSUPP` for `SHARED_VALIDATE` with a flag
    /// outside Linux's legacy set (`SYNC`, `FIXED_NOREPLACE`, unknown
    /// bits: plain `SHARED` ignores them); `EINVAL` for the `DROPPABLE`
    /// type or `GROWSDOWN`; `EACCES` for a shared mapping with
    /// `PROT_WRITE` of a handle not opened for writing, or any mapping of
    /// a handle not opened for reading.
    ///
    /// ```
    /// use aspace::{AddressSpace, Advice, Config, MapFlags, Memfd, Prot};
    ///
    /// // Wasmtime-style instance reset: a private mapping of an image.
    /// let mm = AddressSpace::new(Config::default());
    /// let image = Memfd::new_in(mm.frame_pool(), "image", 8192)?;
    /// image.write_at(b"initial", 0)?;
    /// let rw = Prot::READ | Prot::WRITE;
    /// let a = mm.mmap_fd(0, 8192, rw, MapFlags::PRIVATE, &image, 0)?;
    /// mm.write(a, b"dirty!!")?;
    /// let mut buf = [0u8; 7];
    /// mm.read(a, &mut buf)?;
    /// assert_eq!(&buf, b"dirty!!");
    /// mm.madvise(a, 8192, Advice::DontNeed)?; // reset
    /// mm.read(a, &mut buf)?;
    /// assert_eq!(&buf, b"initial");
    /// # Ok::<(), aspace::Error>(())
    /// ```
    pub fn mmap_fd(
        &self,
        addr: u64,
        len: u64,
        prot: Prot,
        flags: MapFlags,
        memfd: &Memfd,
        offset: u64,
    ) -> Result<u64> {
        if offset % PAGE_SIZE != 0 {
            return Err(Error::Inval);
        }
        // With MAP_ANONYMOUS Linux ignores the descriptor.
        if flags.contains(MapFlags::ANONYMOUS) {
            return self.mmap(addr, len, prot, flags);
        }
        // MAP_HUGETLB on a file that is not hugetlbfs is EINVAL before
        // anything else looks at the flags (ksys_mmap_pgoff).
        if flags.contains(MapFlags::HUGETLB) {
            return Err(Error::Inval);
        }
        if !memfd.frame_pool().shares_memory_with(&self.frames) {
            return Err(Error::CrossDevice);
        }
        let obj = Some(Object {
            pages: memfd.pages(),
            pgoff: offset >> PAGE_SHIFT,
            mode: memfd.mode(),
        });
        self.do_mmap(addr, len, prot, flags, obj)
    }

    /// `mmap` of anonymous memory (`obj` is `None`) or of an object.
    fn do_mmap(
        &self,
        addr: u64,
        len: u64,
        prot: Prot,
        flags: MapFlags,
        obj: Option<Object<'_>>,
    ) -> Result<u64> {
        // Unknown bits are ignored, as Linux's mmap ignores them (only
        // MAP_SHARED_VALIDATE rejects them, and anonymous memory rejects
        // that type below).
        if flags.contains(MapFlags::HUGETLB) {
            return Err(hugetlb_error(addr, len, flags));
        }
        // mmap takes only the access bits of `prot`; other bits are
        // ignored, as in Linux (mprotect rejects them).
        if len == 0 {
            return Err(Error::Inval);
        }
        let len = page_align_up(len).ok_or(Error::NoMem)?;
        let fixed = flags.intersects(MapFlags::FIXED | MapFlags::FIXED_NOREPLACE);
        let hint = if fixed {
            addr
        } else {
            self.round_hint_to_min(addr)
        };
        // Anonymous memory without MAP_SHARED goes to the THP-aligning
        // search (Linux tests the bit: MAP_SHARED_VALIDATE counts, and any
        // other type is refused below anyway); an object by its file
        // system.
        let backing = match obj {
            None if flags.bits() & MapFlags::SHARED.bits() != 0 => Backing::Plain,
            None => Backing::Anon,
            Some(o) if o.pages.aligns_placement() => Backing::File(o.pgoff << PAGE_SHIFT),
            Some(_) => Backing::Plain,
        };
        let (addr, r, vf, populate) = {
            // The edit lives in one of these two, made where it stays (a
            // range writer's inside `begin_range_mmap`): moved out of a
            // returned `Option<Result<(u64, Edit)>>`, it was copied at
            // each layer, 192 bytes read back before their stores had left
            // the store buffer. Both are dropped, the locks released, at
            // the end of this block.
            let mut ranged: Option<Edit<'_>> = None;
            let mut whole: Edit<'_>;
            let (addr, ed): (u64, &mut Edit<'_>) = match self.begin_range_mmap(
                &mut ranged,
                hint,
                len,
                fixed,
                flags,
                backing,
                obj.is_some(),
            ) {
                Some(placed) => (placed?, ranged.as_mut().expect("the range writer's edit")),
                None => {
                    whole = Edit::begin(self);
                    // Linux checks `map_count > max`; we keep the inclusive rule
                    // (the count never exceeds the limit), as Linux since late 2025.
                    if whole.map_count_at_least(self.cfg.max_map_count) {
                        return Err(Error::NoMem);
                    }
                    (
                        self.get_unmapped_area(&whole.view(), hint, len, fixed, flags, backing)?,
                        &mut whole,
                    )
                }
            };
            if addr < self.cfg.mmap_min_addr {
                return Err(Error::Perm);
            }
            // get_unmapped_area keeps `addr + len` within the task size.
            let r = Range::from_len(addr, len).ok_or(Error::NoMem)?;
            if flags.contains(MapFlags::FIXED_NOREPLACE)
                && ed.find_after(addr).is_some_and(|v| v.start() < r.end)
            {
                return Err(Error::Exist);
            }
            // The memlock limit: MAP_LOCKED needs a non-zero one (EPERM), and
            // a lock, asked for or by mlockall(MCL_FUTURE), must fit (EAGAIN).
            if flags.contains(MapFlags::LOCKED) && self.memlock_limit() == 0 {
                return Err(Error::Perm);
            }
            let def_flags = ed.state().def_flags;
            let mut lock = def_flags;
            if flags.contains(MapFlags::LOCKED) {
                lock |= VmFlags::LOCKED;
            }
            if !self.mlock_future_ok(ed, lock, len) {
                return Err(Error::Again);
            }
            // Anonymous memory takes SHARED, PRIVATE or DROPPABLE in the type
            // field (Linux's MAP_SHARED_VALIDATE is for files only; other
            // values are unknown types).
            let ty = flags.bits() & MapFlags::TYPE;
            if let Some(Object { pgoff, .. }) = obj {
                // file_mmap_ok: the mapping must end within the largest size.
                let max_pages =
                    (crate::memfd::MAX_LEN - len.min(crate::memfd::MAX_LEN)) >> PAGE_SHIFT;
                if len > crate::memfd::MAX_LEN || pgoff > max_pages {
                    return Err(Error::Overflow);
                }
            }
            // Files take MAP_SHARED_VALIDATE as shared, rejecting any flag
            // outside the legacy set (a memfd supports no other: not even
            // MAP_SYNC or MAP_FIXED_NOREPLACE).
            if obj.is_some()
                && ty == MapFlags::SHARED_VALIDATE.bits()
                && flags.bits() & !LEGACY_MAP_MASK != 0
            {
                return Err(Error::NotSupported);
            }
            let shared = ty == MapFlags::SHARED.bits()
                || obj.is_some() && ty == MapFlags::SHARED_VALIDATE.bits();
            let droppable = ty == MapFlags::DROPPABLE.bits();
            if !shared && !droppable && ty != MapFlags::PRIVATE.bits() {
                return Err(Error::Inval);
            }
            if obj.is_some() && droppable {
                return Err(Error::Inval);
            }
            if (shared || droppable || obj.is_some()) && flags.contains(MapFlags::GROWSDOWN) {
                return Err(Error::Inval);
            }
            // The handle's access mode, as Linux's do_mmap honours it: a
            // shared writable mapping needs a writable handle, a shared one of
            // a read-only handle loses VM_MAYWRITE (so mprotect cannot add
            // PROT_WRITE) and VM_SHARED (keeping VM_MAYSHARE), and every
            // mapping needs a readable handle.
            let mut read_only_shared = false;
            if let Some(o) = obj {
                if shared && !o.mode.write {
                    if prot.contains(Prot::WRITE) {
                        return Err(Error::AccessDenied);
                    }
                    read_only_shared = true;
                }
                if !o.mode.read {
                    return Err(Error::AccessDenied);
                }
            }
            // Droppable pages cannot be locked (HUGETLB failed above).
            if droppable && flags.contains(MapFlags::LOCKED) {
                return Err(Error::Inval);
            }

            let mut vf = VmFlags::from_prot_in(self, prot) | VmFlags::MAY;
            if shared {
                vf |= VmFlags::SHARED | VmFlags::MAYSHARE;
            }
            if read_only_shared {
                vf -= VmFlags::MAYWRITE | VmFlags::SHARED;
            }
            if flags.contains(MapFlags::GROWSDOWN) {
                vf |= VmFlags::GROWSDOWN;
            }
            if flags.contains(MapFlags::NORESERVE) {
                vf |= VmFlags::NORESERVE;
            }
            // mm->def_flags (VM_LOCKED after mlockall(MCL_FUTURE)), then
            // calc_vm_flag_bits.
            vf |= def_flags;
            if flags.contains(MapFlags::LOCKED) {
                vf |= VmFlags::LOCKED;
            }
            if flags.contains(MapFlags::SYNC) {
                vf |= VmFlags::SYNC;
            }
            if flags.contains(MapFlags::STACK) {
                vf |= VmFlags::NOHUGEPAGE;
            }
            // Locked, or locked by mlockall(MCL_FUTURE): populated, whether or
            // not the lock stays.
            let lock_populates = vf.contains(VmFlags::LOCKED);
            if droppable {
                // Never reserved, copied to a child, dumped or locked (the
                // mlockall(MCL_FUTURE) lock is dropped, as for VM_SPECIAL).
                vf |= VmFlags::DROPPABLE
                    | VmFlags::NORESERVE
                    | VmFlags::WIPEONFORK
                    | VmFlags::DONTDUMP;
                vf -= VmFlags::LOCKED | VmFlags::LOCKONFAULT;
            }
            // Private writable memory is charged (Linux's accountable_mapping).
            if !shared && vf.contains(VmFlags::WRITE) && !vf.contains(VmFlags::NORESERVE) {
                vf |= VmFlags::ACCOUNT;
            }

            // The new VMA's metadata must fit the budget (Linux's
            // vm_area_alloc failing), checked before anything changes.
            if !ed.vma_room(1) {
                return Err(Error::NoMem);
            }
            // MAP_FIXED replaces what is there, data included.
            if fixed {
                ed.unmap(r)?;
                if ed.map_count_at_least(self.cfg.max_map_count) {
                    return Err(Error::NoMem);
                }
            }
            // New memory reads as written since the last soft-dirty reset,
            // and so does every page of a VMA it merges into (Linux's
            // __mmap_complete; see `soft_dirty` for the precision this loses).
            vf |= VmFlags::SOFTDIRTY;
            let v = if let Some(Object {
                pages: obj, pgoff, ..
            }) = obj
            {
                // Merges with a neighbour mapping the same object at the
                // contiguous offset, with the same flags.
                ed.map_new(VmaSpec {
                    shmem: Some(obj.clone()),
                    ..VmaSpec::anon(r, pgoff, vf)
                })
            } else if shared {
                let obj = Arc::new(Shmem::new(
                    next_id(),
                    len >> PAGE_SHIFT,
                    self.frames.clone(),
                ));
                let v = ed.new_vma(VmaSpec {
                    shmem: Some(obj),
                    ..VmaSpec::anon(r, 0, vf)
                });
                ed.insert(v);
                v
            } else {
                ed.map_new(VmaSpec::anon(r, addr >> PAGE_SHIFT, vf))
            };
            // `map_new` write-locked the neighbour it merged into.
            v.set_flags(v.flags() | VmFlags::SOFTDIRTY);
            // Locked memory is populated as mlock does; MAP_POPULATE unless
            // MAP_NONBLOCK says not to; neither where the VMA locks on fault
            // (populate_vma_page_range skips it).
            let populate = (lock_populates
                || flags.contains(MapFlags::POPULATE) && !flags.contains(MapFlags::NONBLOCK))
                && !vf.contains(VmFlags::LOCKONFAULT);
            (addr, r, vf, populate)
        };
        if populate {
            self.populate(r, vf);
        }
        Ok(addr)
    }

    /// With range-locked writers, an mmap of anonymous memory without
    /// `MAP_LOCKED` or `MAP_GROWSDOWN` (and no `mlockall(MCL_FUTURE)` in
    /// force) as a range writer: a fixed one over its range and the hole
    /// around it (it may unmap), any other placed by
    /// [`Edit::begin_placed`]. `None`: take the whole space (also for the
    /// range lock bias's owner, whose whole-space request is granted at
    /// once: `range_bias`; and near `max_map_count`, where only the whole
    /// space's check is exact: `MapCount::far_below`).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn begin_range_mmap<'a>(
        &'a self,
        into: &mut Option<Edit<'a>>,
        hint: u64,
        len: u64,
        fixed: bool,
        flags: MapFlags,
        backing: Backing,
        has_obj: bool,
    ) -> Option<Result<u64>> {
        if !self.mmap_lock.is_range_mode()
            || self.mmap_lock.bias_likely_mine()
            || has_obj
            || flags.intersects(MapFlags::LOCKED | MapFlags::GROWSDOWN)
        {
            return None;
        }
        let addr = if fixed {
            let addr = {
                let pin = self.tree.pin();
                self.get_unmapped_area(&View::new(self, &pin), hint, len, true, flags, backing)
                    // An error takes the whole-space path, which checks the
                    // map count first, as Linux does.
                    .ok()?
            };
            let r = Range::from_len(addr, len)?;
            *into = Some(Edit::begin_range(self, r, Reach::Hole));
            addr
        } else {
            let placed = Edit::begin_placed(self, len, self.placement_near(hint), into, |view| {
                self.get_unmapped_area(view, hint, len, false, flags, backing)
            })?;
            match placed {
                Ok(addr) => addr,
                Err(e) => return Some(Err(e)),
            }
        };
        let ed = into.as_ref().expect("the range writer's edit");
        // Near `max_map_count`, the whole space, whose check is exact
        // (`MmState::map_count_far_below`; a fixed mapping's
        // `begin_range` took it already). mlockall(MCL_FUTURE): the
        // locked-memory limit counts every VMA, so this mmap takes the
        // whole space. Either way the edit is dropped first.
        if !fixed && !ed.state().map_count_far_below(self.cfg.max_map_count)
            || !ed.state().def_flags.is_empty()
        {
            *into = None;
            return None;
        }
        // Linux checks `map_count > max`; we keep the inclusive rule.
        if ed.map_count_at_least(self.cfg.max_map_count) {
            return Some(Err(Error::NoMem));
        }
        Some(Ok(addr))
    }
}

/// What `MAP_HUGETLB` gets with no huge page pool (Linux with
/// `nr_hugepages = 0`): `EINVAL` for a huge page size x86-64 does not have
/// (only 2 MiB and 1 GiB), for a length that rounds to zero and for a
/// fixed address not aligned to the huge page size, else `ENOMEM` (no
/// huge page can be reserved).
fn hugetlb_error(addr: u64, len: u64, flags: MapFlags) -> Error {
    let log = (flags.bits() >> MapFlags::HUGE_SHIFT) & 0x3f;
    let size: u64 = match log {
        0 | 21 => 2 << 20,
        30 => 1 << 30,
        _ => return Error::Inval,
    };
    // A type other than SHARED, PRIVATE or SHARED_VALIDATE (DROPPABLE
    // among them) is refused for the hugetlb file before its reservation.
    if flags.bits() & MapFlags::TYPE & !MapFlags::SHARED_VALIDATE.bits() != 0 {
        return Error::Inval;
    }
    let fixed = flags.intersects(MapFlags::FIXED | MapFlags::FIXED_NOREPLACE);
    match len.checked_next_multiple_of(size) {
        Some(l) if l != 0 && !(fixed && addr % size != 0) => Error::NoMem,
        _ => Error::Inval,
    }
}
