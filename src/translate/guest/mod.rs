//! The address space as vm-memory 0.18's [`GuestMemory`] (feature
//! `vm-memory`), so that everything written against vm-memory's
//! [`Bytes`](vm_memory::Bytes) — virtio queues, device emulation — works on
//! it, with the space's virtual addresses as guest addresses.
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
//! Slices point at frames and hold no translation: like an IOTLB entry a
//! device keeps, a slice used after the guest unmaps or write-protects its
//! page reaches the old frame. Devices take slices per request, as
//! vm-memory's `Bytes` methods do. The bytes are reached with vm-memory's
//! volatile copies, as any guest memory behind vm-memory is, while the
//! guest's own threads use the translator's atomics.

use super::{walk, Lookup};
use crate::addr::PAGE_SIZE;
use crate::mm::{Access, AddressSpace};
use crate::sync::frame::AtomicU64;
use core::iter::FusedIterator;
use core::marker::PhantomData;
use vm_memory::bitmap::BS;
use vm_memory::guest_memory::GuestMemorySliceIterator;
use vm_memory::{
    GuestAddress, GuestMemory, GuestMemoryError, GuestMemoryRegion, GuestMemoryRegionBytes,
    GuestRegionCollection, GuestUsize, Permissions, VolatileSlice,
};

/// What reads of a page that was never written see: vm-memory slices
/// need memory to point at. Only handed out for accesses without write
/// permission.
static ZERO_PAGE: [AtomicU64; (PAGE_SIZE / 8) as usize] =
    [const { AtomicU64::new(0) }; (PAGE_SIZE / 8) as usize];

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

/// The slices of one [`GuestMemory::get_slices`] call: one per page
/// (frames of neighbouring pages are not neighbours).
pub struct PageSlices<'a> {
    pages: std::vec::IntoIter<(*mut u8, usize)>,
    _mm: PhantomData<&'a AddressSpace>,
}

impl<'a> Iterator for PageSlices<'a> {
    type Item = vm_memory::guest_memory::Result<VolatileSlice<'a, ()>>;

    fn next(&mut self) -> Option<Self::Item> {
        let (p, n) = self.pages.next()?;
        // SAFETY: `p..p + n` lies inside one frame (or the static zero
        // page), memory that lives as long as the address space the slice
        // borrows; every other access to it is atomic or volatile.
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

/// Translates `[addr, addr + count)` for `access`, faulting pages in:
/// each page's memory and the length used in it.
fn device_pages(
    mm: &AddressSpace,
    addr: GuestAddress,
    count: usize,
    access: Permissions,
) -> Result<Vec<(*mut u8, usize)>, GuestMemoryError> {
    let start = addr.0;
    let end = start
        .checked_add(count as u64)
        .filter(|&e| e <= mm.cfg.task_size)
        .ok_or(GuestMemoryError::InvalidGuestAddress(addr))?;
    let write = access.has_write();
    let kind = if write { Access::Write } else { Access::Read };
    let mut out = Vec::new();
    let mut a = start;
    while a < end {
        let page = a & !(PAGE_SIZE - 1);
        let n = ((page + PAGE_SIZE).min(end) - a) as usize;
        let base = loop {
            match walk(mm, page, write).0 {
                Lookup::Frame(b) => break b,
                Lookup::Zero => break ZERO_PAGE.as_ptr() as *mut u8,
                Lookup::Fault => mm
                    .fault(page, kind)
                    .map_err(|_| GuestMemoryError::InvalidGuestAddress(GuestAddress(a)))?,
            }
        };
        // SAFETY: `a - page < PAGE_SIZE`, inside the frame.
        out.push((unsafe { base.add((a - page) as usize) }, n));
        a += n as u64;
    }
    Ok(out)
}

impl GuestMemory for AddressSpace {
    type PhysicalMemory = GuestRegionCollection<NoPhysicalRegion>;
    type Bitmap = ();

    fn check_range(&self, addr: GuestAddress, count: usize, access: Permissions) -> bool {
        device_pages(self, addr, count, access).is_ok()
    }

    fn get_slices<'a>(
        &'a self,
        addr: GuestAddress,
        count: usize,
        access: Permissions,
    ) -> vm_memory::guest_memory::Result<impl GuestMemorySliceIterator<'a, BS<'a, ()>>> {
        Ok(PageSlices {
            pages: device_pages(self, addr, count, access)?.into_iter(),
            _mm: PhantomData,
        })
    }
}
