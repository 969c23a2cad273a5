//! Names of anonymous VMAs: `prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME)`.
//!
//! # Locking
//!
//! The mmap_lock write side through `Edit`; see [`crate::mm`]. With range
//! writers, only the range's neighbourhood (`mm/range_lock.rs`), as
//! mprotect.

use super::edit::{Edit, Reach};
use super::AddressSpace;
use crate::addr::{is_page_aligned, Range, PAGE_SIZE};
use crate::error::{Error, Result};
use crate::sync::Arc;
use crate::vma::{AnonName, VmFlags, VmaRef};

/// Longest name, in bytes (`ANON_VMA_NAME_MAX_LEN` less its NUL).
pub const ANON_NAME_MAX: usize = 79;

/// Linux's `is_valid_name_char`: printable ASCII except `\`, `` ` ``, `$`,
/// `[` and `]`.
fn valid_name(name: &str) -> bool {
    name.len() <= ANON_NAME_MAX
        && name
            .bytes()
            .all(|c| (0x20..0x7f).contains(&c) && !b"\\`$[]".contains(&c))
}

impl AddressSpace {
    /// Names the anonymous memory of `[addr, addr + len)`, or clears its
    /// name with `None`, like `prctl(PR_SET_VMA, PR_SET_VMA_ANON_NAME)`.
    /// Named VMAs show as `[anon:NAME]` in [`maps`](Self::maps) (shared
    /// ones as `[anon_shmem:NAME]`), split where the name starts and ends,
    /// and merge only with neighbours of the same name. Forks and mremap
    /// keep the name.
    ///
    /// Errors as Linux's: `EINVAL` for a name longer than 79 bytes or with
    /// a byte outside printable ASCII or one of `` \`$[] ``, for an
    /// unaligned `addr` or a wrapping range; `ENOMEM` when part of the
    /// range is unmapped (the mapped parts are named).
    pub fn set_anon_name(&self, addr: u64, len: u64, name: Option<&str>) -> Result<()> {
        if name.is_some_and(|n| !valid_name(n)) {
            return Err(Error::Inval);
        }
        if !is_page_aligned(addr) {
            return Err(Error::Inval);
        }
        let alen = len.wrapping_add(PAGE_SIZE - 1) & !(PAGE_SIZE - 1);
        if len != 0 && alen == 0 {
            return Err(Error::Inval);
        }
        let end = addr.checked_add(alen).ok_or(Error::Inval)?;
        if end == addr {
            return Ok(());
        }
        let name = name.map(|n| Arc::new(AnonName(n.into())));
        self.modify_each(Range::new(addr, end), |v| Ok((v.flags(), name.clone())))
    }

    /// Gives each VMA's part of `r` the flags and name `want` says, under
    /// the mmap_lock write side, splitting and merging (Linux's
    /// `madvise_walk_vmas` with `madvise_update_vma`). An error from `want`
    /// stops at that VMA; holes are skipped, then reported as `ENOMEM`.
    /// With range writers it locks only `r`'s neighbourhood, as mprotect
    /// does: it splits and merges with the same `Edit::modify` and changes
    /// no entry, so the VMAs overlapping `r` a page wider on each side are
    /// all it reads or changes. `r` is not empty.
    pub(crate) fn modify_each(
        &self,
        r: Range,
        mut want: impl FnMut(&VmaRef) -> Result<(VmFlags, Option<Arc<AnonName>>)>,
    ) -> Result<()> {
        let mut ed = Edit::begin_range(self, r, Reach::Vmas);
        let mut hole = false;
        let mut cursor = r.start;
        while cursor < r.end {
            let Some(v) = ed.find_after(cursor).filter(|v| v.start() < r.end) else {
                break;
            };
            if v.start() > cursor {
                hole = true;
                cursor = v.start();
            }
            let e = v.end().min(r.end);
            let (flags, name) = want(&v)?;
            let cur = if flags == v.flags() && v.name() == name.as_deref().map(|n| &*n.0) {
                v
            } else {
                ed.modify(v, cursor, e, flags, name)?
            };
            // A merge may have carried the VMA past `e`.
            cursor = e.max(cur.end());
        }
        if hole || cursor < r.end {
            Err(Error::NoMem)
        } else {
            Ok(())
        }
    }
}
