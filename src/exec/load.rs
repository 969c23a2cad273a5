//! Mapping a program's and its interpreter's loadable segments, in the
//! order and with the placement of Linux's binfmt_elf (`elf_map`,
//! `elf_load`, `load_elf_binary`'s loop and `load_elf_interp`).
//!
//! Each `PT_LOAD` maps its file pages privately with its protection, from
//! the page holding `p_vaddr` to the end of its file bytes; the rest of
//! the last file page is zeroed when the segment is writable (a
//! copy-on-write copy, as Linux's `padzero`), and whole pages of bss past
//! it are mapped anonymously (Linux's `vm_brk_flags`, a read-write
//! mapping, executable if the segment is).

use super::elf::{Elf, ProgramHeader, ET_DYN, ET_EXEC, PF_R, PF_W, PF_X};
use super::object::map_object;
use super::ExecError;
use crate::addr::{page_align_down, page_align_up, PAGE_SIZE};
use crate::{AddressSpace, Error, MapFlags, Prot};

/// Where a program landed.
pub(crate) struct Loaded {
    /// Added to every address of the file (0 for `ET_EXEC`).
    pub(crate) bias: u64,
    /// The address of the program headers in memory (`AT_PHDR`).
    pub(crate) phdr: u64,
    /// The end of the highest segment in memory: the heap starts at its
    /// page-aligned value.
    pub(crate) end: u64,
}

fn prot_of(p: &ProgramHeader) -> Prot {
    let mut prot = Prot::NONE;
    if p.p_flags & PF_R != 0 {
        prot |= Prot::READ;
    }
    if p.p_flags & PF_W != 0 {
        prot |= Prot::WRITE;
    }
    if p.p_flags & PF_X != 0 {
        prot |= Prot::EXEC;
    }
    prot
}

fn page_off(a: u64) -> u64 {
    a & (PAGE_SIZE - 1)
}

fn align_up(a: u64) -> Result<u64, ExecError> {
    page_align_up(a).ok_or(ExecError::Mm(Error::Inval))
}

/// `a + b`, or EINVAL for a segment whose sizes pass the end of memory.
fn add(a: u64, b: u64) -> Result<u64, ExecError> {
    a.checked_add(b).ok_or(ExecError::Mm(Error::Inval))
}

/// Bytes from the first segment's page to the end of the last one in
/// memory (Linux's `total_mapping_size`); 0 without segments.
fn total_size(elf: &Elf) -> Result<u64, ExecError> {
    let (Some(first), Some(last)) = (elf.loads().next(), elf.loads().last()) else {
        return Ok(0);
    };
    last.p_vaddr
        .checked_add(last.p_memsz)
        .and_then(|e| e.checked_sub(page_align_down(first.p_vaddr)))
        .ok_or(ExecError::Mm(Error::Inval))
}

/// Largest power-of-two `p_align` of the loadable segments, at least a
/// page (Linux's `maximum_alignment`).
fn max_alignment(elf: &Elf) -> u64 {
    elf.loads()
        .map(|p| p.p_align)
        .filter(|a| a.is_power_of_two())
        .max()
        .unwrap_or(0)
        .max(PAGE_SIZE)
}

/// Maps one segment's file pages at `addr` (Linux's `elf_map`): with a
/// `total` size the whole image's room is reserved first, where
/// placement puts it, and what lies past this segment is unmapped again.
/// Returns where the segment's first page went.
fn elf_map(
    mm: &AddressSpace,
    elf: &Elf,
    addr: u64,
    p: &ProgramHeader,
    flags: MapFlags,
    total: u64,
) -> Result<u64, ExecError> {
    let size = align_up(add(p.p_filesz, page_off(p.p_vaddr))?)?;
    let off = p
        .p_offset
        .checked_sub(page_off(p.p_vaddr))
        .ok_or(ExecError::Mm(Error::Inval))?;
    let addr = page_align_down(addr);
    let prot = prot_of(p);
    if total == 0 {
        return map_object(mm, addr, size, prot, flags, &elf.obj, off);
    }
    let total = align_up(total)?;
    let at = map_object(mm, addr, total, prot, flags, &elf.obj, off)?;
    if total > size {
        mm.munmap(at + size, total - size)?;
    }
    Ok(at)
}

/// Maps one segment (Linux's `elf_load`): its file pages, the zeroed
/// tail of the last one, and anonymous pages for the rest of its bss.
fn elf_load(
    mm: &AddressSpace,
    elf: &Elf,
    addr: u64,
    p: &ProgramHeader,
    flags: MapFlags,
    total: u64,
) -> Result<u64, ExecError> {
    let map_addr = if p.p_filesz != 0 {
        elf_map(mm, elf, addr, p, flags, total)?
    } else {
        page_align_down(addr)
    };
    let seg = add(map_addr, page_off(p.p_vaddr))?;
    let zero_start = if p.p_filesz != 0 {
        add(seg, p.p_filesz)?
    } else {
        map_addr
    };
    let zero_end = add(seg, p.p_memsz)?;
    if p.p_memsz > p.p_filesz {
        let tail = align_up(zero_start)? - zero_start;
        if p.p_filesz != 0 && tail != 0 {
            // Errors are ignored where the segment is not writable, as
            // Linux's padzero.
            let zeros = vec![0u8; tail as usize];
            if let Err(e) = mm.write(zero_start, &zeros) {
                if p.p_flags & PF_W != 0 {
                    return Err(ExecError::Mm(e));
                }
            }
        }
        let (zs, ze) = (align_up(zero_start)?, align_up(zero_end)?);
        if ze > zs {
            let prot = Prot::READ | Prot::WRITE | (prot_of(p) & Prot::EXEC);
            let anon = MapFlags::PRIVATE | MapFlags::ANONYMOUS | MapFlags::FIXED;
            mm.mmap(zs, ze - zs, prot, anon)?;
        }
    }
    Ok(map_addr)
}

/// Checks a segment as Linux does after mapping it: file bytes within
/// memory bytes, and the segment inside the task.
fn check_segment(mm: &AddressSpace, bias: u64, p: &ProgramHeader) -> Result<(), ExecError> {
    let task = mm.config().task_size;
    let k = bias.wrapping_add(p.p_vaddr);
    if k >= task || p.p_filesz > p.p_memsz || p.p_memsz > task || task - p.p_memsz < k {
        return Err(ExecError::Mm(Error::Inval));
    }
    Ok(())
}

/// Linux x86-64's `ELF_ET_DYN_BASE` for a task of `task_size` bytes: two
/// thirds of it (0x5555_5555_4aaa with 4-level paging), where a PIE goes
/// when ASLR is off, after rounding down to its alignment.
pub(crate) fn et_dyn_base(task_size: u64) -> u64 {
    task_size / 3 * 2
}

/// Maps the program's segments (Linux's `load_elf_binary` loop): an
/// `ET_EXEC` at its addresses, a PIE run through an interpreter at
/// `ELF_ET_DYN_BASE` (no randomization), a PIE without one (a static PIE
/// or an interpreter run directly) where mmap's top-down placement puts
/// its whole image.
pub(crate) fn load_program(
    mm: &AddressSpace,
    elf: &Elf,
    has_interp: bool,
) -> Result<Loaded, ExecError> {
    let mut bias = 0u64;
    let mut first = true;
    let mut phdr = 0u64;
    let mut end = 0u64;
    for p in elf.loads() {
        let mut flags = MapFlags::PRIVATE;
        let mut total = 0;
        if !first {
            flags |= MapFlags::FIXED;
        } else if elf.hdr.e_type == ET_EXEC {
            flags |= MapFlags::FIXED_NOREPLACE;
        } else if elf.hdr.e_type == ET_DYN {
            if has_interp {
                let align = max_alignment(elf);
                bias = et_dyn_base(mm.config().task_size) & !(align - 1);
                flags |= MapFlags::FIXED_NOREPLACE;
            }
            bias = page_align_down(bias.wrapping_sub(p.p_vaddr));
            total = total_size(elf)?;
            if total == 0 {
                return Err(ExecError::Mm(Error::Inval));
            }
        }
        let at = elf_load(mm, elf, bias.wrapping_add(p.p_vaddr), p, flags, total)?;
        if first {
            first = false;
            if elf.hdr.e_type == ET_DYN {
                bias = bias
                    .wrapping_add(at.wrapping_sub(page_align_down(bias.wrapping_add(p.p_vaddr))));
            }
        }
        if p.p_offset <= elf.hdr.e_phoff && elf.hdr.e_phoff - p.p_offset < p.p_filesz {
            phdr = (elf.hdr.e_phoff - p.p_offset).wrapping_add(p.p_vaddr);
        }
        check_segment(mm, bias, p)?;
        // Checked just above: inside the task.
        end = end.max(bias.wrapping_add(p.p_vaddr) + p.p_memsz);
    }
    Ok(Loaded {
        bias,
        phdr: phdr.wrapping_add(bias),
        end,
    })
}

/// Maps the interpreter (Linux's `load_elf_interp`): its whole image where
/// placement puts it (top-down from the mmap base), each later segment
/// fixed after the first. Returns its load address (`AT_BASE`).
pub(crate) fn load_interp(mm: &AddressSpace, elf: &Elf, no_base: u64) -> Result<u64, ExecError> {
    let mut total = total_size(elf)?;
    let mut load_addr = 0u64;
    let mut set = false;
    for p in elf.loads() {
        let mut flags = MapFlags::PRIVATE;
        if elf.hdr.e_type == ET_EXEC || set {
            flags |= MapFlags::FIXED;
        } else if no_base == 0 && elf.hdr.e_type == ET_DYN {
            load_addr = p.p_vaddr.wrapping_neg();
        }
        let at = elf_load(mm, elf, load_addr.wrapping_add(p.p_vaddr), p, flags, total)?;
        total = 0;
        if !set && elf.hdr.e_type == ET_DYN {
            load_addr = at.wrapping_sub(page_align_down(p.p_vaddr));
            set = true;
        }
        check_segment(mm, load_addr, p).map_err(|_| ExecError::Mm(Error::NoMem))?;
    }
    Ok(load_addr)
}
