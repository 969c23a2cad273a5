//! What `/proc/pid/maps` shows: [`VmaInfo`] snapshots of the VMAs, the
//! maps and smaps lines, the `[heap]` and `[stack]` labels only the
//! address space knows, and the conversions between [`Prot`] and the VMA
//! flags.
//!
//! # Locking
//!
//! Snapshots are taken under the mmap_lock read side, so every VMA they
//! read is stable and the labels agree with the break and the start
//! stack; see [`crate::mm`].

use super::brk::Heap;
use super::{AddressSpace, MmState, Prot};
use crate::addr::{Range, PAGE_SHIFT};
use crate::vma::{VmFlags, Vma};

impl VmFlags {
    /// The access bits of a protection.
    pub fn from_prot(p: Prot) -> VmFlags {
        VmFlags::from_bits_truncate(p.bits() & Prot::ACCESS.bits())
    }

    /// The access bits of a protection in `mm`, with the execute-only key
    /// for `PROT_EXEC` alone where the space models protection keys
    /// ([`Config::exec_only_pkey`](crate::Config::exec_only_pkey)).
    pub(crate) fn from_prot_in(mm: &AddressSpace, p: Prot) -> VmFlags {
        let f = VmFlags::from_prot(p);
        if mm.cfg.exec_only_pkey && f & VmFlags::ACCESS == VmFlags::EXEC {
            f | VmFlags::EXEC_ONLY
        } else {
            f
        }
    }

    /// The protection these flags grant.
    pub fn prot(self) -> Prot {
        Prot::from_bits_truncate((self & VmFlags::ACCESS).bits())
    }
}

/// A snapshot of one VMA, as `vmas()` returns it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VmaInfo {
    /// First address.
    pub start: u64,
    /// First address past the end.
    pub end: u64,
    /// Protection.
    pub prot: Prot,
    /// All flags.
    pub flags: VmFlags,
    /// A shared mapping.
    pub shared: bool,
    /// A growsdown (stack) mapping.
    pub growsdown: bool,
    /// Page offset in the backing object (`vm_pgoff`).
    pub pgoff: u64,
    /// An anon_vma has been assigned (the VMA was written to).
    pub anon_vma: bool,
    /// Identity of the backing object, if any (the inode `maps` prints).
    pub shmem_id: Option<u64>,
    /// The name of the [`Memfd`](crate::Memfd) mapped, if the object is one.
    pub memfd_name: Option<String>,
    /// The host file mapped, if the object is a file object
    /// ([`Memfd::from_file`](crate::Memfd::from_file)): maps shows its
    /// device, inode and path instead of a memfd's.
    pub file: Option<crate::file::MappedFile>,
    /// This is the brk heap.
    pub heap: bool,
    /// This VMA contains the initial stack pointer
    /// ([`set_start_stack`](crate::AddressSpace::set_start_stack)): maps
    /// shows it as `[stack]`.
    pub stack: bool,
    /// The name given with [`set_anon_name`](crate::AddressSpace::set_anon_name).
    pub name: Option<String>,
}

impl VmaInfo {
    /// `[start, end)`.
    pub fn range(&self) -> Range {
        Range::new(self.start, self.end)
    }

    /// The `VmFlags:` line `/proc/pid/smaps` prints for this VMA (no
    /// newline), e.g. `VmFlags: rd wr mr mw me lo ac `.
    pub fn smaps_vmflags(&self) -> String {
        let mut s = String::from("VmFlags:");
        for m in self.flags.mnemonics() {
            s.push(' ');
            s.push_str(m);
        }
        s.push(' ');
        s
    }

    /// The line `/proc/pid/maps` prints for this VMA (no newline).
    pub fn maps_line(&self) -> String {
        let p = |b: bool, c: char| if b { c } else { '-' };
        let perms = format!(
            "{}{}{}{}",
            p(self.prot.contains(Prot::READ), 'r'),
            p(self.prot.contains(Prot::WRITE), 'w'),
            p(self.prot.contains(Prot::EXEC), 'x'),
            if self.shared { 's' } else { 'p' }
        );
        let head = match self.shmem_id {
            Some(_) if self.file.is_some() => {
                let f = self.file.as_ref().expect("checked");
                format!(
                    "{:08x}-{:08x} {} {:08x} {:02x}:{:02x} {}",
                    self.start,
                    self.end,
                    perms,
                    self.pgoff << PAGE_SHIFT,
                    f.dev.0,
                    f.dev.1,
                    f.inode
                )
            }
            Some(ino) => format!(
                "{:08x}-{:08x} {} {:08x} 00:01 {}",
                self.start,
                self.end,
                perms,
                self.pgoff << PAGE_SHIFT,
                ino
            ),
            None => format!(
                "{:08x}-{:08x} {} 00000000 00:00 0",
                self.start, self.end, perms
            ),
        };
        // show_map_vma: a shared mapping's object first, then the heap,
        // the stack, then an anonymous VMA's name.
        let path = match (&self.name, self.shmem_id.is_some()) {
            _ if self.file.is_some() => {
                self.file.as_ref().map_or(String::new(), |f| f.path.clone())
            }
            _ if self.memfd_name.is_some() => {
                format!(
                    "/memfd:{} (deleted)",
                    self.memfd_name.as_deref().unwrap_or("")
                )
            }
            (Some(n), true) => format!("[anon_shmem:{n}]"),
            (None, true) => "/dev/zero (deleted)".to_string(),
            _ if self.heap => "[heap]".to_string(),
            _ if self.stack => "[stack]".to_string(),
            (Some(n), false) => format!("[anon:{n}]"),
            (None, false) => String::new(),
        };
        if path.is_empty() {
            format!("{head} ")
        } else {
            format!("{head:<72} {path}")
        }
    }
}

/// The public snapshot of `v`, with the labels only the address space
/// knows (`[heap]`, `[stack]`). Under the mmap_lock.
pub(crate) fn snapshot(st: &MmState, heap: &Heap, v: &Vma) -> VmaInfo {
    let f = v.flags();
    let r = v.range();
    VmaInfo {
        start: r.start,
        end: r.end,
        prot: f.prot(),
        flags: f,
        shared: f.contains(VmFlags::SHARED) || f.contains(VmFlags::MAYSHARE),
        growsdown: f.contains(VmFlags::GROWSDOWN),
        pgoff: v.pgoff(),
        anon_vma: v.has_anon_vma(),
        // SAFETY: snapshots are taken under the mmap_lock (vmas, vma_at,
        // the writers' own checks), which keeps `v` and its object.
        shmem_id: unsafe { v.shmem() }.map(|s| s.id),
        // SAFETY: as above.
        memfd_name: unsafe { v.shmem() }.and_then(|s| s.name.as_deref().map(str::to_string)),
        // SAFETY: as above.
        file: unsafe { v.shmem() }.and_then(|s| {
            let host = s.host.as_ref()?;
            Some(host.mapped_file(s.name.as_deref().unwrap_or("")))
        }),
        heap: heap.labels(r),
        stack: is_stack(st, r),
        name: v.name().map(str::to_string),
    }
}

/// Linux (`vma_is_initial_stack`) prints `[stack]` for the VMA that
/// contains `mm->start_stack`, both ends inclusive: a VMA that ends
/// exactly at it is labelled too. After a split only the pieces touching
/// it keep the label. No start stack (0), no label.
pub(crate) fn is_stack(st: &MmState, r: Range) -> bool {
    st.start_stack != 0 && r.start <= st.start_stack && st.start_stack <= r.end
}

impl AddressSpace {
    /// The VMA containing `addr`, if any (one VMA, without snapshotting
    /// the others as [`vmas`](Self::vmas) does).
    pub fn vma_at(&self, addr: u64) -> Option<VmaInfo> {
        let st = self.mmap_lock.read();
        let g = self.tree.pin();
        self.tree
            .find(addr, &g)
            .map(|(_, v)| snapshot(&st, &self.heap, v))
    }

    /// Snapshot of every VMA, in address order.
    pub fn vmas(&self) -> Vec<VmaInfo> {
        let st = self.mmap_lock.read();
        let g = self.tree.pin();
        self.tree
            .iter(&g)
            .map(|(_, v)| snapshot(&st, &self.heap, v))
            .collect()
    }

    /// The VMAs in `/proc/pid/maps` format, one line each.
    pub fn maps(&self) -> String {
        let mut s = String::new();
        for v in self.vmas() {
            s.push_str(&v.maps_line());
            s.push('\n');
        }
        s
    }
}
