//! An address space as vm-memory 0.18's [`GuestMemory`] (feature
//! `vm-memory`), so that everything written against vm-memory's
//! [`Bytes`](vm_memory::Bytes) — virtio queues, device emulation — works on
//! it, with the space's virtual addresses as guest addresses.
//!
//! The memory is a [`GuestView`] of the space
//! ([`AddressSpace::guest_memory`], or [`GuestView::new`] over an
//! `Arc<AddressSpace>`), never the space itself: slices reach frames
//! without a translation, as a device does, and the view is what keeps
//! those frames from being freed or reused under them.
//!
//! Guest RAM usually starts at guest-physical address 0, below a default
//! space's `mmap_min_addr` (64 KiB, as Linux's `vm.mmap_min_addr`, which
//! makes a fixed mapping there `EPERM`): a VMM's space is made with
//! `Config { mmap_min_addr: 0, ..Config::default() }` and maps its RAM at 0
//! with `MapFlags::FIXED` (the README's vm-memory section has the example).
//!
//! It is the IOMMU-aware trait: every access names its [`Permissions`],
//! and, as an IOMMU would, [`check_range`](GuestMemory::check_range) and
//! [`get_slices`](GuestMemory::get_slices) translate page by page through
//! the page table, faulting pages in like a CPU (a write breaks
//! copy-on-write and allocates frames) and refusing what the VMAs forbid.
//! `get_slices` translates the whole range before it returns a slice, so
//! a range with an unmapped or (for writes) read-only page is an error and
//! nothing of it is written; the error is
//! `InvalidGuestAddress(first page that failed)`. `Permissions::No` is
//! checked as a read.
//!
//! # Pins
//!
//! Safe code can write through any [`VolatileSlice`], one asked for with
//! `Permissions::Read` included, and keep it as long as it borrows the
//! view. So `get_slices` pins every frame it hands out (`pin`, Linux's
//! long-term `FOLL_PIN`):
//!
//! - a pinned frame is not freed or reused while pinned: after munmap,
//!   `MADV_DONTNEED`, mremap, a memfd shrink or a free by another space of
//!   the pool, a slice reaches the frame as it was, which no one else
//!   maps, never memory handed out again;
//! - only a page its mapping owns is pinned: in a private mapping the zero
//!   page, a copy-on-write page and an object page are first replaced by
//!   a private copy, even for a read; after fork the child gets its own
//!   copy of a pinned page and the parent keeps the pinned one; a shared
//!   mapping's slice is the object's page itself, which is shared by
//!   design;
//! - a device's writes are dirty-tracked: a pinned page reads written in
//!   `pagemap_scan` and soft-dirty in `pagemap` until the first reset
//!   after its pin is dropped (as VFIO reports pinned pages dirty).
//!
//! A view pins each frame once, however many slices of it it hands out,
//! and keeps its pins until it is dropped, or until
//! [`GuestView::release_pins`], the explicit quiescence point: both need
//! the view unborrowed, so no slice is left. A long-lived view thus holds
//! every frame its devices touched (at most the frames of the memory
//! budget, to which they stay charged); a device that should let the
//! guest's unmapped memory go takes a view per request, or quiesces
//! between requests.
//!
//! The bytes are reached with vm-memory's volatile copies, as any guest
//! memory behind vm-memory is, while the guest's own threads use the
//! translator's atomics.

mod pin;

use super::{walk, Lookup};
use crate::addr::PAGE_SIZE;
use crate::mm::{Access, AddressSpace};
use crate::phys::Pfn;
use crate::sync::Mutex;
use core::iter::FusedIterator;
use core::marker::PhantomData;
use core::ops::Deref;
use pin::{pin_page, Unpinned};
use std::collections::HashSet;
use vm_memory::bitmap::BS;
use vm_memory::guest_memory::GuestMemorySliceIterator;
use vm_memory::{
    GuestAddress, GuestMemory, GuestMemoryError, GuestMemoryRegion, GuestMemoryRegionBytes,
    GuestRegionCollection, GuestUsize, Permissions, VolatileSlice,
};

/// The [`GuestMemory::PhysicalMemory`] of an address space: there is no
/// flat physical memory behind it (its frames are reached only through
/// translation), so [`GuestMemory::physical_memory`] is `None` and no
/// value of this type exists.
#[derive(Debug)]
pub enum NoPhysicalRegion {}

impl GuestMemoryRegion for NoPhysicalRegion {
    type B = ();
    fn len(&self) -> GuestUsize {
        match *self {}
    }
    fn start_addr(&self) -> GuestAddress {
        match *self {}
    }
    fn bitmap(&self) -> BS<'_, ()> {
        match *self {}
    }
}

impl GuestMemoryRegionBytes for NoPhysicalRegion {}

/// A device's view of an address space: vm-memory's [`GuestMemory`],
/// whose slices stay valid because the view pins the frames they reach
/// (see the [module docs](self)). `M` is how it holds the space: a
/// reference ([`AddressSpace::guest_memory`]) or an owner such as
/// `Arc<AddressSpace>`.
///
/// ```
/// use aspace::{AddressSpace, Config, MapFlags, Prot};
/// use vm_memory::{Bytes, GuestAddress, GuestMemory, Permissions};
/// let mm = AddressSpace::new(Config::default());
/// let a = mm.mmap(0, 4096, Prot::READ | Prot::WRITE,
///                 MapFlags::PRIVATE | MapFlags::ANONYMOUS).unwrap();
/// let mut mem = mm.guest_memory();
/// mem.write_obj(7u64, GuestAddress(a)).unwrap();
/// let s = mem.get_slices(GuestAddress(a), 8, Permissions::Read).unwrap()
///     .next().unwrap().unwrap();
/// mm.munmap(a, 4096).unwrap();            // the frame stays pinned
/// assert_eq!(s.read_obj::<u64>(0).unwrap(), 7);
/// assert_eq!(mm.frames_used(), 1);
/// mem.release_pins();                     // no slice is left: quiesce
/// assert_eq!(mm.frames_used(), 0);
/// ```
///
/// No slice outlives the view, nor is held across a release:
///
/// ```compile_fail
/// use aspace::{AddressSpace, Config};
/// use vm_memory::{GuestAddress, GuestMemory, Permissions};
/// let mm = AddressSpace::new(Config::default());
/// let mut mem = mm.guest_memory();
/// let s = mem.get_slices(GuestAddress(0), 8, Permissions::Read);
/// mem.release_pins();
/// drop(s);
/// ```
pub struct GuestView<M: Deref<Target = AddressSpace>> {
    mm: M,
    /// The frames this view pinned, each once.
    /// Protected by: its mutex, a leaf lock (taken with at most the
    /// space's mmap_lock read side held).
    pins: Mutex<HashSet<Pfn>>,
}

impl AddressSpace {
    /// A device's view of this space as vm-memory's [`GuestMemory`]; its
    /// slices pin the frames they reach until it is dropped (see
    /// [`GuestView`]).
    pub fn guest_memory(&self) -> GuestView<&AddressSpace> {
        GuestView::new(self)
    }
}

impl<M: Deref<Target = AddressSpace>> GuestView<M> {
    /// A view of the space `mm` holds, with no pins yet.
    pub fn new(mm: M) -> Self {
        GuestView {
            mm,
            pins: Mutex::new(HashSet::new()),
        }
    }

    /// The address space viewed.
    pub fn space(&self) -> &AddressSpace {
        &self.mm
    }

    /// Frames pinned by this view now.
    pub fn pinned_frames(&self) -> usize {
        self.pins.lock().len()
    }

    /// Drops every pin (the quiescence point): frames nothing else holds
    /// any more (unmapped since they were pinned) are freed. Taking the
    /// view mutably proves that no slice of it is left.
    pub fn release_pins(&mut self) {
        let frames = &self.mm.frames;
        for pfn in self.pins.get_mut().drain() {
            frames.unpin(pfn);
        }
    }

    /// Translates and pins `[addr, addr + count)` for `access`, faulting
    /// pages in: each page's memory and the length used in it.
    fn pin_range(
        &self,
        addr: GuestAddress,
        count: usize,
        access: Permissions,
    ) -> Result<Vec<(*mut u8, usize)>, GuestMemoryError> {
        let mm: &AddressSpace = &self.mm;
        let (start, end) = bounds(mm, addr, count)?;
        let write = access.has_write();
        let mut out = Vec::new();
        let mut st = None;
        let mut a = start;
        while a < end {
            let page = a & !(PAGE_SIZE - 1);
            let n = ((page + PAGE_SIZE).min(end) - a) as usize;
            let failed = || GuestMemoryError::InvalidGuestAddress(GuestAddress(a));
            let pfn = loop {
                let guard = st.get_or_insert_with(|| mm.mmap_lock.read());
                match pin_page(mm, guard, page, write) {
                    Ok(pfn) => break pfn,
                    Err(Unpinned::NoMemory) => return Err(failed()),
                    Err(Unpinned::Fault) => {
                        // A fault may take the mmap_lock itself.
                        st = None;
                        mm.fault(page, access_of(write)).map_err(|_| failed())?;
                    }
                }
            };
            if !self.pins.lock().insert(pfn) {
                // Already pinned by this view: one pin is enough.
                mm.frames.unpin(pfn);
            }
            let base = mm.frames.frame_ptr(pfn);
            // SAFETY: `a - page < PAGE_SIZE`, inside the frame.
            out.push((unsafe { base.add((a - page) as usize) }, n));
            a += n as u64;
        }
        Ok(out)
    }
}

impl<M: Deref<Target = AddressSpace>> Drop for GuestView<M> {
    fn drop(&mut self) {
        self.release_pins();
    }
}

impl<M: Deref<Target = AddressSpace>> core::fmt::Debug for GuestView<M> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("GuestView")
            .field("space", &self.mm.id)
            .field("pinned_frames", &self.pinned_frames())
            .finish()
    }
}

/// `[addr, addr + count)` if it lies inside the space's task size.
fn bounds(
    mm: &AddressSpace,
    addr: GuestAddress,
    count: usize,
) -> Result<(u64, u64), GuestMemoryError> {
    let end = addr
        .0
        .checked_add(count as u64)
        .filter(|&e| e <= mm.cfg.task_size)
        .ok_or(GuestMemoryError::InvalidGuestAddress(addr))?;
    Ok((addr.0, end))
}

fn access_of(write: bool) -> Access {
    if write {
        Access::Write
    } else {
        Access::Read
    }
}

/// Whether every page of `[addr, addr + count)` allows `access`, faulting
/// pages in as a CPU would (nothing is pinned).
fn check(mm: &AddressSpace, addr: GuestAddress, count: usize, access: Permissions) -> bool {
    let Ok((start, end)) = bounds(mm, addr, count) else {
        return false;
    };
    let write = access.has_write();
    let mut page = start & !(PAGE_SIZE - 1);
    while page < end {
        while let Lookup::Fault = walk(mm, page, access_of(write)).0 {
            if mm.fault(page, access_of(write)).is_err() {
                return false;
            }
        }
        page += PAGE_SIZE;
    }
    true
}

/// The slices of one [`GuestMemory::get_slices`] call: one per page
/// (frames of neighbouring pages are not neighbours).
pub struct PageSlices<'a> {
    pages: std::vec::IntoIter<(*mut u8, usize)>,
    _view: PhantomData<&'a ()>,
}

impl<'a> Iterator for PageSlices<'a> {
    type Item = vm_memory::guest_memory::Result<VolatileSlice<'a, ()>>;

    fn next(&mut self) -> Option<Self::Item> {
        let (p, n) = self.pages.next()?;
        // SAFETY: `p..p + n` lies inside one frame that the view borrowed
        // for `'a` pinned: it is neither freed nor reused before the view
        // drops or releases its pins, which needs the borrow to end, and
        // frame memory lives as long as the allocator the view's space
        // holds. Every other access to it is atomic or volatile.
        Some(Ok(unsafe { VolatileSlice::new(p, n) }))
    }
}

impl FusedIterator for PageSlices<'_> {}

impl<'a> GuestMemorySliceIterator<'a, ()> for PageSlices<'a> {}

impl core::fmt::Debug for PageSlices<'_> {
    fn fmt(&self, f: &mut core::fmt::Formatter<'_>) -> core::fmt::Result {
        f.debug_struct("PageSlices")
            .field("left", &self.pages.len())
            .finish()
    }
}

impl<M: Deref<Target = AddressSpace>> GuestMemory for GuestView<M> {
    type PhysicalMemory = GuestRegionCollection<NoPhysicalRegion>;
    type Bitmap = ();

    fn check_range(&self, addr: GuestAddress, count: usize, access: Permissions) -> bool {
        check(&self.mm, addr, count, access)
    }

    fn get_slices<'a>(
        &'a self,
        addr: GuestAddress,
        count: usize,
        access: Permissions,
    ) -> vm_memory::guest_memory::Result<impl GuestMemorySliceIterator<'a, BS<'a, ()>>> {
        Ok(PageSlices {
            pages: self.pin_range(addr, count, access)?.into_iter(),
            _view: PhantomData,
        })
    }
}
