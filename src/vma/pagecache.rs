//! An object's pages on first touch, and back to their host file: a
//! missing page gets a frame of its contents — zeros, or the host file's
//! bytes ([`crate::file`]) — published into the tree by compare-and-swap
//! (a loser frees its own), and a file object's dirty pages are written
//! back from their frames.
//!
//! # Locking
//!
//! Lock-free, as the rest of [`Shmem`]: a frame is filled before it is
//! published, so every user sees the whole page; writeback takes a frame
//! reference only while the frame lives and the slot still holds it (as
//! `zero_range` does), and runs host I/O with no lock held but the
//! caller's.

use super::Shmem;
use crate::addr::PAGE_SIZE;
use crate::error::{Error, FaultError, Result};
use crate::phys::Pfn;
use crate::sync::Ordering;

impl Shmem {
    /// A new frame (one reference) holding page `index`'s first contents:
    /// zeros, or the host file's bytes.
    fn fresh_frame(&self, index: u64) -> Result<Pfn> {
        let Some(host) = &self.host else {
            return self.frames.alloc().ok_or(Error::NoMem);
        };
        let pfn = self.frames.alloc_uninit().ok_or(Error::NoMem)?;
        let mut page = [0u8; PAGE_SIZE as usize];
        if let Err(e) = host.read_page(index, &mut page) {
            self.frames.put(pfn);
            return Err(e);
        }
        self.frames.write(pfn, 0, &page);
        Ok(pfn)
    }

    /// The frame of page `index`, made on first touch (a copy into the
    /// object). `ENOMEM` when out of memory, a host error when the file
    /// could not be read. The caller must check `index < npages`.
    pub(crate) fn frame(&self, index: u64) -> Result<Pfn> {
        let slot = self.leaf_slot(index).ok_or(Error::NoMem)?;
        let cur = slot.load(Ordering::Acquire);
        if cur != 0 {
            return Ok(Pfn::new((cur - 1) as u32));
        }
        let pfn = self.fresh_frame(index)?;
        match slot.compare_exchange(
            0,
            u64::from(pfn.get()) + 1,
            Ordering::AcqRel,
            Ordering::Acquire,
        ) {
            Ok(_) => Ok(pfn),
            Err(winner) => {
                self.frames.put(pfn);
                Ok(Pfn::new((winner - 1) as u32))
            }
        }
    }

    /// Puts `pfn` at page `index` if the object has no frame there, the
    /// reference the caller holds moving to the object (a userfault
    /// handler's `UFFDIO_COPY` into a hole). `Err(Some(existing))` if the
    /// page is there, `Err(None)` if the budget has no room for the index;
    /// either way `pfn` stays the caller's. The caller checks
    /// `index < npages`.
    pub(crate) fn insert(&self, index: u64, pfn: Pfn) -> core::result::Result<(), Option<Pfn>> {
        let mut node = &self.root;
        for level in (1..self.height).rev() {
            node = self
                .child_or_make(&node.slots[Self::slot(index, level)])
                .ok_or(None)?;
        }
        node.slots[Self::slot(index, 0)]
            .compare_exchange(
                0,
                u64::from(pfn.get()) + 1,
                Ordering::AcqRel,
                Ordering::Acquire,
            )
            .map(|_| ())
            .map_err(|winner| Some(Pfn::new((winner - 1) as u32)))
    }

    /// The frame of page `index` with a reference for the caller (to map
    /// it or copy from it), made on first touch; `mapped_writable` says a
    /// shared mapping that may store to it will map it (a file object then
    /// counts the page dirty, see [`crate::file`]). `OutOfMemory` when out
    /// of memory, `Bus` when a shrink made `index` past the end or the
    /// host file could not be read (Linux's `VM_FAULT_SIGBUS` for an I/O
    /// error). Safe against a shrink freeing the page meanwhile: the
    /// reference is taken only while the frame is not free, and kept only
    /// if the slot still holds it afterwards (else the caller would map a
    /// frame the object dropped: it looks again). The caller checks the
    /// end again under the PTE lock before it maps the frame (see
    /// [`super::mappings`]).
    pub(crate) fn get_frame(
        &self,
        index: u64,
        mapped_writable: bool,
    ) -> core::result::Result<Pfn, FaultError> {
        let pfn = self.get_frame_ref(index)?;
        if let (Some(host), true) = (&self.host, mapped_writable) {
            host.mark_mapped(index);
        }
        Ok(pfn)
    }

    fn get_frame_ref(&self, index: u64) -> core::result::Result<Pfn, FaultError> {
        let slot = self.leaf_slot(index).ok_or(FaultError::OutOfMemory)?;
        loop {
            let cur = slot.load(Ordering::Acquire);
            if cur == 0 {
                // A shrink may have emptied the slot: do not refill it
                // past the end (a fault that races that check fills one
                // page there, dropped by the next shrink).
                if index >= self.npages() {
                    return Err(FaultError::Bus);
                }
                let pfn = self.fresh_frame(index).map_err(|e| match e {
                    Error::NoMem => FaultError::OutOfMemory,
                    _ => FaultError::Bus,
                })?;
                self.frames.get(pfn); // the caller's, besides the object's
                let v = u64::from(pfn.get()) + 1;
                match slot.compare_exchange(0, v, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return Ok(pfn),
                    Err(_) => {
                        self.frames.put(pfn);
                        self.frames.put(pfn);
                        continue;
                    }
                }
            }
            let pfn = Pfn::new((cur - 1) as u32);
            if self.frames.try_get(pfn) {
                if slot.load(Ordering::Acquire) == cur {
                    return Ok(pfn);
                }
                self.frames.put(pfn);
            } else {
                // Free: a shrink emptied the slot before freeing it; wait
                // to see that (or the frame back in the slot, in use).
                crate::sync::wait_until(|| {
                    slot.load(Ordering::Acquire) != cur || self.frames.refcount(pfn) != 0
                });
            }
        }
    }

    /// Writes the dirty pages among `[first, end)` (indices) back to the
    /// host file; nothing for an object with none. Each page is copied
    /// out of its frame under a reference taken while the frame lives and
    /// the slot still holds it; a page a shrink dropped meanwhile is
    /// skipped.
    pub(crate) fn writeback(&self, first: u64, end: u64) -> Result<()> {
        let Some(host) = &self.host else {
            return Ok(());
        };
        host.writeback(first, end, |index, buf| {
            let Some(pfn) = self.resident(index) else {
                return false;
            };
            if !self.frames.try_get(pfn) {
                return false;
            }
            let held = self.resident(index) == Some(pfn);
            if held {
                self.frames.read(pfn, 0, buf);
            }
            self.frames.put(pfn);
            held
        })
    }
}
