//! A translator's loads, stores, bulk copies and instruction fetches:
//! aligned scalars on the hit path (an entry check and one `mov`), the
//! rest through `with_span`, page by page.
//!
//! # Locking
//!
//! None (see the parent module).

use super::word::{copy_in, copy_out, load, store};
use super::{frame_of, perm, Lookup, Scalar, Translator, PAGE_MASK};
use crate::addr::PAGE_SIZE;
use crate::error::{FaultError, MemoryFault};
use crate::mm::Access;

impl Translator<'_> {
    /// Reads `buf.len()` bytes at `addr` (any alignment; crossing pages
    /// that each fault in as needed). On an error, the bytes of the pages
    /// before the failing one are already in `buf` (`done` of them).
    pub fn read(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        self.copy_out(addr, buf, Access::Read)
    }

    /// Fetches `buf.len()` instruction bytes at `addr`: [`read`](Self::read)
    /// with execute permission, so a page of a mapping without
    /// `PROT_EXEC` faults (`SEGV_ACCERR`, x86-64's NX) and an execute-only
    /// one ([`Config::exec_only_pkey`](crate::Config::exec_only_pkey))
    /// does not.
    pub fn fetch_insn(&mut self, addr: u64, buf: &mut [u8]) -> Result<(), MemoryFault> {
        self.copy_out(addr, buf, Access::Exec)
    }

    /// Fetches the `T` at `addr` as instruction bytes (any alignment;
    /// execute permission as for [`fetch_insn`](Self::fetch_insn); the
    /// error's `done` is 0, as for [`load`](Self::load)).
    pub fn fetch<T: Scalar>(&mut self, addr: u64) -> Result<T, MemoryFault> {
        let mut b = [0u8; 8];
        // A scalar is done whole or not at all, like a load.
        self.fetch_insn(addr, &mut b[..T::SIZE])
            .map_err(|e| MemoryFault { done: 0, ..e })?;
        Ok(T::from_bits(u64::from_le_bytes(b)))
    }

    /// Copies `buf.len()` bytes at `addr` out for `access`, page by page.
    fn copy_out(&mut self, addr: u64, buf: &mut [u8], access: Access) -> Result<(), MemoryFault> {
        let mut done = 0;
        while done < buf.len() {
            let a = next(addr, done)?;
            let off = (a & !PAGE_MASK) as usize;
            let n = (PAGE_SIZE as usize - off).min(buf.len() - done);
            let chunk = &mut buf[done..done + n];
            self.with_span(a, n, access, |l, _| copy_out(frame_of(l), off, chunk))
                .map_err(|e| MemoryFault { done, ..e })?;
            done += n;
        }
        Ok(())
    }

    /// Writes `data` at `addr` (any alignment; crossing pages that each
    /// fault in as needed, copy-on-write pages being copied). On an error,
    /// the pages before the failing one are written (`done` bytes), as by
    /// a real `memcpy`.
    pub fn write(&mut self, addr: u64, data: &[u8]) -> Result<(), MemoryFault> {
        let mut done = 0;
        while done < data.len() {
            let a = next(addr, done)?;
            let off = (a & !PAGE_MASK) as usize;
            let n = (PAGE_SIZE as usize - off).min(data.len() - done);
            let chunk = &data[done..done + n];
            self.with_span(a, n, Access::Write, |l, _| {
                if let Lookup::Frame(base) = l {
                    copy_in(base, off, chunk);
                }
            })
            .map_err(|e| MemoryFault { done, ..e })?;
            done += n;
        }
        Ok(())
    }

    /// Loads a `T` at `addr`. Naturally aligned loads are single atomic
    /// loads; others (which may cross a page: both pages must be readable)
    /// are assembled from bytes and may tear, as a split load may on
    /// hardware.
    #[inline]
    pub fn load<T: Scalar>(&mut self, addr: u64) -> Result<T, MemoryFault> {
        let busy = self.enter();
        if let Some(base) = self.hit(addr, perm(Access::Read), T::SIZE as u64) {
            let off = (addr & !PAGE_MASK) as usize;
            // SAFETY: `base` is a cached frame, `off` inside the page
            // and `T`-aligned (the hit checked it).
            let bits = unsafe { load::<T>(base, off) };
            self.leave(busy);
            return Ok(T::from_bits(bits));
        }
        self.leave(busy);
        self.load_slow(addr)
    }

    #[inline(never)]
    fn load_slow<T: Scalar>(&mut self, addr: u64) -> Result<T, MemoryFault> {
        let mut b = [0u8; 8];
        let off = (addr & !PAGE_MASK) as usize;
        let split = (PAGE_SIZE as usize - off).min(T::SIZE);
        let buf = &mut b[..T::SIZE];
        self.with_span(addr, T::SIZE, Access::Read, |x, y| {
            let (lo, hi) = buf.split_at_mut(split);
            copy_out(frame_of(x), off, lo);
            copy_out(frame_of(y), 0, hi);
        })?;
        Ok(T::from_bits(u64::from_le_bytes(b)))
    }

    /// Stores `v` at `addr`. A store to a write-protected copy-on-write
    /// page faults and copies first. Naturally aligned stores of every
    /// width are single atomic stores; others (which may cross a page:
    /// both pages must be writable, or nothing is written) may tear.
    #[inline]
    pub fn store<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), MemoryFault> {
        let busy = self.enter();
        if let Some(base) = self.hit(addr, perm(Access::Write), T::SIZE as u64) {
            let off = (addr & !PAGE_MASK) as usize;
            // SAFETY: `base` is a cached frame, `off` inside the page
            // and `T`-aligned (the hit checked it).
            unsafe { store::<T>(base, off, v.to_bits()) };
            self.leave(busy);
            return Ok(());
        }
        self.leave(busy);
        self.store_slow(addr, v)
    }

    #[inline(never)]
    fn store_slow<T: Scalar>(&mut self, addr: u64, v: T) -> Result<(), MemoryFault> {
        let b = v.to_bits().to_le_bytes();
        let off = (addr & !PAGE_MASK) as usize;
        let split = (PAGE_SIZE as usize - off).min(T::SIZE);
        let (lo, hi) = b[..T::SIZE].split_at(split);
        self.with_span(addr, T::SIZE, Access::Write, |x, y| {
            if let (Lookup::Frame(a), Lookup::Frame(b)) = (x, y) {
                copy_in(a, off, lo);
                copy_in(b, 0, hi);
            }
        })
    }
}

/// The address `done` bytes past `addr`; the first byte past the top of
/// the address space faults there.
fn next(addr: u64, done: usize) -> Result<u64, MemoryFault> {
    addr.checked_add(done as u64).ok_or(MemoryFault {
        addr: u64::MAX,
        kind: FaultError::NoMapping,
        done,
    })
}
