//! Guest words in frame memory: the [`Scalar`] types a translator loads
//! and stores, loads and stores of every width, and byte copies done as
//! 8-byte atomic words.
//!
//! Frame memory is shared with other threads and translators, and other
//! code (`phys`, `mm.read`) reads it as `AtomicU64` words, so every access
//! must be atomic, and Rust's memory model has no mixed-size atomics: a
//! `u32` store cannot be an `AtomicU32` store on memory others access as
//! `AtomicU64`. So:
//!
//! - on x86-64, aligned loads and stores of 1, 2 and 4 bytes are one
//!   `mov` (`movzx`) of that width in inline assembly ([`load`],
//!   [`store`]), the same one instruction as an 8-byte access. Assembly
//!   is outside Rust's memory model: its effect is the instruction's, and
//!   x86-64 makes an aligned `mov` of 1, 2, 4 or 8 bytes single-copy
//!   atomic (Intel SDM vol. 3A, 9.1.1), with acquire (load) and release
//!   (store) order under TSO. Every other access to frame memory is an
//!   atomic instruction too (`mov`, `lock cmpxchg`), so no access to it
//!   is a non-atomic race on the hardware, which is the only semantics
//!   left to the bytes once assembly accesses them. A narrow load of its
//!   own width also lets the CPU forward a narrow store just made to the
//!   same place (a guest's push then pop): an 8-byte load of the word
//!   that a narrower store only partly wrote waits for that store to
//!   reach the cache instead (the `store+load` rows in docs/RESULTS.md);
//! - elsewhere, narrow loads are 8-byte atomic loads of the containing
//!   word, shifted, and narrow stores compare-and-swap loops on it.
//!
//! A guest's racing stores are thus a data race in the guest, never
//! undefined behaviour here.
//!
//! # Locking
//!
//! None: only atomics on frame words (`sync::frame`, invisible to loom on
//! purpose: guest data is not part of a protocol). Order of the locks that
//! exist: [`crate::mm`].

use crate::sync::frame::{AtomicU64 as FrameWord, Ordering as FrameOrdering};

mod sealed {
    pub trait Sealed {}
}

/// The integer types a [`Translator`](super::Translator) loads, stores and operates on
/// atomically (sealed: `u8`..`u64`, `i8`..`i64`).
pub trait Scalar: sealed::Sealed + Copy + Eq + core::fmt::Debug {
    /// Size in bytes (1, 2, 4 or 8).
    const SIZE: usize;
    /// The value's bits, zero-extended.
    fn to_bits(self) -> u64;
    /// The value of the low `SIZE` bytes of `bits`.
    fn from_bits(bits: u64) -> Self;
}

macro_rules! scalar {
    ($($t:ty => $u:ty),*) => {$(
        impl sealed::Sealed for $t {}
        impl Scalar for $t {
            const SIZE: usize = core::mem::size_of::<$t>();
            #[inline(always)]
            fn to_bits(self) -> u64 {
                self as $u as u64
            }
            #[inline(always)]
            fn from_bits(bits: u64) -> Self {
                bits as $u as $t
            }
        }
    )*};
}
scalar!(u8 => u8, u16 => u16, u32 => u32, u64 => u64, i8 => u8, i16 => u16, i32 => u32, i64 => u64);

/// Mask of a `T`'s bits in a word.
#[inline(always)]
pub(super) fn mask<T: Scalar>() -> u64 {
    if T::SIZE == 8 {
        !0
    } else {
        (1u64 << (T::SIZE * 8)) - 1
    }
}

/// The 8-byte word of a frame holding byte `off`.
///
/// # Safety
/// `base` is a frame's first byte (from `FrameAllocator::frame_ptr`, valid
/// while the allocator lives) and `off < PAGE_SIZE`.
#[inline(always)]
pub(super) unsafe fn word<'f>(base: *mut u8, off: usize) -> &'f FrameWord {
    // SAFETY: per the contract the word lies inside the frame's 4096
    // bytes, which are 4096-aligned, so it is 8-aligned; frames live as
    // long as the allocator and every shared access to them is atomic.
    unsafe { &*(base.add(off & !7) as *const FrameWord) }
}

/// Loads the `T` at frame byte `off`, which is `T`-aligned, atomically
/// (Acquire): its bits, zero-extended.
///
/// # Safety
/// As for [`word`]; `off % T::SIZE == 0`.
#[inline(always)]
pub(super) unsafe fn load<T: Scalar>(base: *mut u8, off: usize) -> u64 {
    if T::SIZE == 8 {
        // SAFETY: the caller's contract is `word`'s.
        return unsafe { word(base, off) }.load(FrameOrdering::Acquire);
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `base + off` is inside a live frame (the caller's contract)
    // and `T`-aligned, so the `mov` is one single-copy-atomic load of
    // those bytes (see the module docs for why assembly may load from
    // memory others access as `AtomicU64`). Neither `nomem` nor
    // `readonly`: the compiler keeps later memory accesses after it
    // (Acquire, with TSO), as for a `store`.
    unsafe {
        use core::arch::asm;
        let (b, o) = (base, off);
        let v: u64;
        match T::SIZE {
            1 => asm!("movzx {v:e}, byte ptr [{b} + {o}]",
                b = in(reg) b, o = in(reg) o, v = lateout(reg) v,
                options(nostack, preserves_flags)),
            2 => asm!("movzx {v:e}, word ptr [{b} + {o}]",
                b = in(reg) b, o = in(reg) o, v = lateout(reg) v,
                options(nostack, preserves_flags)),
            _ => asm!("mov {v:e}, dword ptr [{b} + {o}]",
                b = in(reg) b, o = in(reg) o, v = lateout(reg) v,
                options(nostack, preserves_flags)),
        }
        v
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        // SAFETY: the caller's contract is `word`'s.
        let w = unsafe { word(base, off) }.load(FrameOrdering::Acquire);
        (w >> ((off % 8) * 8)) & mask::<T>()
    }
}

/// Stores the low `T::SIZE` bytes of `bits` at frame byte `off`, which
/// is `T`-aligned, atomically (Release).
///
/// # Safety
/// As for [`word`]; `off % T::SIZE == 0`.
#[inline(always)]
pub(super) unsafe fn store<T: Scalar>(base: *mut u8, off: usize, bits: u64) {
    if T::SIZE == 8 {
        // SAFETY: the caller's contract is `word`'s.
        unsafe { word(base, off) }.store(bits, FrameOrdering::Release);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `base + off` is inside a live frame (the caller's contract)
    // and `T`-aligned, so the `mov` is one single-copy-atomic store of
    // those bytes (see the module docs for why assembly may store into
    // memory others read as `AtomicU64`). No `nomem`: the compiler keeps
    // earlier memory accesses before it (Release, with TSO).
    unsafe {
        use core::arch::asm;
        let (b, o) = (base, off);
        match T::SIZE {
            1 => asm!("mov byte ptr [{b} + {o}], {v}",
                b = in(reg) b, o = in(reg) o, v = in(reg_byte) bits as u8,
                options(nostack, preserves_flags)),
            2 => asm!("mov word ptr [{b} + {o}], {v:x}",
                b = in(reg) b, o = in(reg) o, v = in(reg) bits as u16,
                options(nostack, preserves_flags)),
            _ => asm!("mov dword ptr [{b} + {o}], {v:e}",
                b = in(reg) b, o = in(reg) o, v = in(reg) bits as u32,
                options(nostack, preserves_flags)),
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let shift = (off % 8) * 8;
        let m = mask::<T>() << shift;
        // SAFETY: the caller's contract is `word`'s.
        let w = unsafe { word(base, off) };
        let _ = w.fetch_update(FrameOrdering::Release, FrameOrdering::Relaxed, |old| {
            Some((old & !m) | ((bits << shift) & m))
        });
    }
}

/// Copies frame bytes `[off, off + buf.len())` into `buf` (`None`: the
/// zero page).
pub(super) fn copy_out(frame: Option<*mut u8>, off: usize, buf: &mut [u8]) {
    let Some(base) = frame else {
        buf.fill(0);
        return;
    };
    let mut pos = 0;
    while pos < buf.len() {
        let at = off + pos;
        let lo = at % 8;
        let n = (8 - lo).min(buf.len() - pos);
        // SAFETY: callers keep `off + buf.len() <= PAGE_SIZE`.
        let w = unsafe { word(base, at) }.load(FrameOrdering::Acquire);
        buf[pos..pos + n].copy_from_slice(&w.to_le_bytes()[lo..lo + n]);
        pos += n;
    }
}

/// Copies `data` into frame bytes `[off, off + data.len())`.
pub(super) fn copy_in(base: *mut u8, off: usize, data: &[u8]) {
    let mut pos = 0;
    while pos < data.len() {
        let at = off + pos;
        let lo = at % 8;
        let n = (8 - lo).min(data.len() - pos);
        // SAFETY: callers keep `off + data.len() <= PAGE_SIZE`.
        let w = unsafe { word(base, at) };
        let src = &data[pos..pos + n];
        if n == 8 {
            let v = u64::from_le_bytes(src.try_into().expect("8 bytes"));
            w.store(v, FrameOrdering::Release);
        } else {
            let _ = w.fetch_update(FrameOrdering::Release, FrameOrdering::Relaxed, |old| {
                let mut b = old.to_le_bytes();
                b[lo..lo + n].copy_from_slice(src);
                Some(u64::from_le_bytes(b))
            });
        }
        pos += n;
    }
}
